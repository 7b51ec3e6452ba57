"""The declared dependency floors as pip constraints, so a test run can install exactly them.

A floor (`tenacity>=9.2.1`) is a promise that the code works with that release; nothing checks
it while every machine installs the newest one. `make test-floors` builds an environment at the
floors and runs the in-process tests in it: this script writes its constraints (`name==floor`
for every core dependency and every extra's requirement with a floor, each exact pin as it is)
and, with `--check`, confirms what got installed.

Every core dependency must declare a floor (the script refuses one without). torch is the one
exception to "install the floor": CPU machines use the pinned CPU wheel on disk (an unpinned
torch pulls a multi-GB CUDA build), so the constraints hold torch at the `cpu` extra's pin and
the floors step never replaces it. Extras' requirements without a floor are left to the resolver
(listed on stderr).

    python3 scripts/dependency_floors.py --extras cpu,dev > floors.txt
    pip install -c floors.txt -e '.[cpu,dev]'
    python scripts/dependency_floors.py --extras cpu,dev --check    # installed versions == floors
"""
from __future__ import annotations

import argparse
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"
_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*(.*?)\s*(;.*)?$")


def _parse(requirement: str) -> tuple[str, str]:
    match = _REQUIREMENT.match(requirement)
    if not match:
        raise ValueError(f"pyproject.toml: cannot parse requirement {requirement!r}")
    return match.group(1).lower().replace("_", "-"), match.group(3).replace(" ", "")


def _bound(spec: str, op: str) -> str | None:
    for part in filter(None, spec.split(",")):
        if part.startswith(op) and not part.startswith(op + "="):
            return part[len(op):]
    return None


def constraints(extras: list[str], pyproject: Path = PYPROJECT) -> tuple[dict[str, str], list[str], list[str]]:
    """({name: pinned version}, [core dependency names], [extras' requirements left free])."""
    project = tomllib.loads(pyproject.read_text())["project"]
    pins: dict[str, str] = {}
    missing = []
    for requirement in project["dependencies"]:
        name, spec = _parse(requirement)
        floor = _bound(spec, ">=") or _bound(spec, "==")
        if floor is None:
            missing.append(requirement)
        else:
            pins[name] = floor
    if missing:
        raise SystemExit(f"{pyproject}: core dependencies without a floor: {', '.join(missing)}; declare the oldest "
                         "release whose API the code uses (name>=X.Y) and run `make test-floors`")
    free = []
    for extra in extras:
        for requirement in project["optional-dependencies"][extra]:
            name, spec = _parse(requirement)
            exact, floor = _bound(spec, "=="), _bound(spec, ">=")
            if exact is not None:
                pins[name] = exact  # an extra's exact pin wins (torch: the CPU wheel)
            elif floor is not None:
                pins.setdefault(name, floor)
            elif name not in pins:
                free.append(requirement)
    return pins, sorted(_parse(r)[0] for r in project["dependencies"]), free


def _module(name: str) -> str:
    """The import name of an installed distribution (its top_level.txt, else its name)."""
    top = (importlib.metadata.distribution(name).read_text("top_level.txt") or "").split()
    return next((m for m in top if m.replace("_", "-") == name or m == name.split("-")[0]), top[0] if top else
                name.replace("-", "_"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extras", required=True, help="comma-separated extras installed with the package (the Makefile's EXTRAS)")
    parser.add_argument("--check", action="store_true", help="compare the installed versions with the floors")
    args = parser.parse_args()
    pins, core, free = constraints(args.extras.split(","))
    if not args.check:
        print("# written by scripts/dependency_floors.py from pyproject.toml: core floors and extras' pins")
        for name, version in sorted(pins.items()):
            print(f"{name}=={version}")
        if free:
            print(f"dependency_floors: left to the resolver (no floor): {', '.join(free)}", file=sys.stderr)
        return
    from packaging.version import Version

    wrong = []
    for name, version in sorted(pins.items()):
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            installed = "not installed"
        # a local version label (torch's "+cpu") is the same release
        ok = installed != "not installed" and Version(Version(installed).base_version) == Version(version)
        print(f"  {name:<18} floor {version:<10} installed {installed}{'' if ok else '   <-- differs'}")
        if not ok:
            wrong.append(name)
    if wrong:
        raise SystemExit(f"dependency_floors: installed versions differ from the floors: {', '.join(wrong)}")
    for name in core:  # each core dependency imports at its floor (some are used only lazily)
        importlib.import_module(_module(name))
    print(f"dependency_floors: {len(pins)} floors installed; {len(core)} core dependencies import")


if __name__ == "__main__":
    main()
