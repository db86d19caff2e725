"""`radiance`: the appliance's command line. Exit codes: see launcher/errors.py and README.md."""
from __future__ import annotations

import importlib
import sys

import click

from radiance import envs

from . import console, errors

# Each command's module is imported only when it runs: `radiance down` on a host whose cores the engine
# saturates must send its signal in a fraction of a second, not after importing aiohttp, pydantic and the gate.
_COMMANDS = ("check", "up", "gate", "bench", "status", "logs", "down", "gateway", "build", "export")


class _Group(click.Group):
    """Turns every launcher error into one line and its exit code; tracebacks only with RADIANCE_DEBUG=1.
    Loads a command's module on first use."""

    def list_commands(self, ctx):
        return list(_COMMANDS)

    def get_command(self, ctx, name):
        if name not in _COMMANDS:
            return None
        return importlib.import_module(f"{__package__}.commands.{name}").command

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except errors.LauncherError as exc:
            if _debug():
                raise
            console.error(str(exc))
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            console.error("interrupted")
            sys.exit(130)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException, SystemExit):
            raise
        except Exception as exc:  # an unexpected bug still gets one line, and a way to see more
            if _debug():
                raise
            console.error(f"{type(exc).__name__}: {exc} (set RADIANCE_DEBUG=1 for the traceback)")
            sys.exit(errors.RUNTIME_ERROR)


def _debug() -> bool:
    try:
        return bool(envs.get("RADIANCE_DEBUG"))
    except envs.KnobError:
        return False


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="radiance", prog_name="radiance")
def cli() -> None:
    """RADIANCE: Qwen3-Next on vLLM with four performance patches, exposed only after its gate passes.

    \b
    Exit codes: 0 ok, 1 runtime error, 2 usage/profile error, 3 gate failed,
                4 hardware incompatible, 5 endpoint unreachable, 6 check inconclusive.
    """



def main() -> None:
    # click reports usage errors with exit code 2 already; keep that.
    cli(prog_name="radiance")


if __name__ == "__main__":
    main()
