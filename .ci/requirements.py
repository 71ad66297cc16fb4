"""Print the requirements of toolreg and the given extras, one per line (for `.ci/run`).

`.ci/run` installs these into several virtual environments at once and then the project itself
with `--no-deps`, one environment at a time: an editable install writes the project's metadata
into the source tree, so two of them must not run side by side. Needs Python 3.11+ (tomllib).
"""

import sys
from pathlib import Path

import tomllib


def requirements(extras: list[str]) -> list[str]:
    project = tomllib.loads(Path("pyproject.toml").read_text(encoding="utf-8"))["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [extra for extra in extras if extra not in optional]
    if unknown:
        raise SystemExit(f"no such extra in pyproject.toml: {', '.join(unknown)}")
    found = list(project.get("dependencies", []))
    for extra in extras:
        found.extend(optional[extra])
    return list(dict.fromkeys(found))


if __name__ == "__main__":
    print("\n".join(requirements(sys.argv[1].split(","))))
