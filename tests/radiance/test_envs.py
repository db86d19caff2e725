import pytest

from radiance import envs


def test_defaults_parse_without_environment():
    env = {}
    assert envs.get("RADIANCE_DRAFT_TAU", env) == pytest.approx(0.1)
    assert envs.get("RADIANCE_DRAFT_SCHEDULE", env) == ((1, 8), (2, 7), (4, 6), (8, 5), (16, 4))
    assert envs.get("RADIANCE_DYNAMIC_DRAFT", env) is False
    assert envs.get("RADIANCE_ENABLE", env) is True
    assert envs.validate_all(env) == []


@pytest.mark.parametrize("name,value,needle", [
    ("RADIANCE_DRAFT_TAU", "abc", "expected a number"),
    ("RADIANCE_DRAFT_TAU", "1.5", "[0, 1]"),
    ("RADIANCE_DRAFT_SCHEDULE", "1-8", "batch_size:max_depth"),
    ("RADIANCE_DRAFT_SCHEDULE", "4:6,2:7", "strictly increasing"),
    ("RADIANCE_DYNAMIC_DRAFT", "maybe", "expected one of"),
    ("RADIANCE_LOG_LEVEL", "LOUD", "expected one of"),
])
def test_bad_values_name_variable_value_and_fix(name, value, needle):
    with pytest.raises(envs.KnobError) as exc:
        envs.get(name, {name: value})
    assert name in str(exc.value) and repr(value) in str(exc.value) and needle in str(exc.value)


def test_empty_schedule_disables_the_cap():
    assert envs.get("RADIANCE_DRAFT_SCHEDULE", {"RADIANCE_DRAFT_SCHEDULE": ""}) == ()


def test_unknown_names_are_reported():
    assert envs.unknown_names({"RADIANCE_TAU": "1", "RADIANCE_DRAFT_TAU": "0.3", "PATH": "/"}) == ["RADIANCE_TAU"]


def test_module_attribute_reads_environment(monkeypatch):
    monkeypatch.setenv("RADIANCE_DRAFT_TAU", "0.5")
    assert envs.RADIANCE_DRAFT_TAU == 0.5


def test_every_knob_is_declared_once_and_documented():
    names = [k.name for k in envs._KNOBS]
    assert len(names) == len(set(names))
    assert all(k.doc and k.name.startswith("RADIANCE_") for k in envs._KNOBS)


def test_no_radiance_knob_is_read_outside_envs(repo_root):
    """House rule: RADIANCE_* names are only parsed in radiance/envs.py (the launcher only writes them)."""
    import re

    offenders = []
    for path in list((repo_root / "radiance").rglob("*.py")) + list((repo_root / "launcher").rglob("*.py")):
        if path.name == "envs.py":
            continue
        text = path.read_text()
        if re.search(r"os\.environ(\.get)?\s*[\[(]\s*['\"]RADIANCE_", text) or \
                re.search(r"getenv\(\s*['\"]RADIANCE_", text):
            offenders.append(str(path))
    assert offenders == []


def test_every_radiance_name_used_in_the_repo_is_declared(repo_root):
    import re

    files = [p for d in ("radiance", "launcher", "images", "tools", "profiles") for p in (repo_root / d).rglob("*")
             if p.is_file() and p.suffix in (".py", ".yaml", ".yml", ".sh", "") and "__pycache__" not in p.parts]
    files += [repo_root / n for n in ("compose.yaml", "Makefile", "README.md") if (repo_root / n).exists()]
    used = {}
    for path in files:
        for name in re.findall(r"\bRADIANCE_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(errors="replace")):
            used.setdefault(name, str(path))
    not_knobs = {"RADIANCE_PREFIX"}  # Python constant names, not environment variables
    unknown = {n: p for n, p in used.items() if n not in envs.KNOBS and n not in not_knobs}
    assert unknown == {}
