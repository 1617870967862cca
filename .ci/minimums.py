"""Print `name==floor` for each dependency named on the command line, its floor the `>=` bound in pyproject.toml.

The minimum-versions job of `.ci/run` installs these pins, so the floors it tests are the declared ones."""

import re
import sys
import tomllib

project = tomllib.load(open("pyproject.toml", "rb"))["project"]
specs = project["dependencies"] + [d for group in project["optional-dependencies"].values() for d in group]
floors = {m[1].lower(): m[2] for m in (re.match(r"([A-Za-z0-9_.-]+)\s*>=\s*([^,;\s]+)", s) for s in specs) if m}
missing = [name for name in sys.argv[1:] if name not in floors]
if missing:
    sys.exit(f"no '>=' floor in pyproject.toml for {', '.join(missing)}; floors: {', '.join(sorted(floors))}")
print(" ".join(f"{name}=={floors[name]}" for name in sys.argv[1:]))
