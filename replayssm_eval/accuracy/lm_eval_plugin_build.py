"""setuptools commands that install `replayssm_eval_lm_eval.pth` into site-packages (pyproject's `cmdclass`).

The .pth runs `lm_eval_plugin.py` at interpreter start-up; that file says why lm-eval 0.4.13 needs
it. A wheel gets the .pth from `build_py`, at the wheel's root. An editable install (`pip install
-e`) builds its wheel without `build_py`'s files, so `editable_wheel` adds it to that wheel, as
coverage.py does for its own .pth. setuptools loads this file by path at build time: it imports
setuptools only, nothing of the package.
"""

import zipfile
from pathlib import Path

from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

PTH_NAME = "replayssm_eval_lm_eval.pth"  # sorts after setuptools' "__editable__.*.pth": the package is importable by then
HOOK = Path(__file__).with_name("lm_eval_plugin.py")


def pth_text() -> str:
    """One line starting with `import` (the only lines site.py executes): lm_eval_plugin.py, then its install()."""
    source = ascii(HOOK.read_text(encoding="utf-8"))  # ascii: site.py reads .pth files in the locale's encoding
    return f"import sys; ns = {{'__name__': 'replayssm_eval_lm_eval_pth'}}; exec({source}, ns); ns['install']()\n"


class BuildPy(build_py):
    def run(self):
        super().run()
        if not self.editable_mode:
            Path(self.build_lib, PTH_NAME).write_text(pth_text(), encoding="ascii")

    def get_outputs(self, include_bytecode=True):
        outputs = super().get_outputs(include_bytecode)
        return outputs if self.editable_mode else [*outputs, str(Path(self.build_lib, PTH_NAME))]


class EditableWheel(editable_wheel):
    def run(self):
        super().run()
        for wheel in Path(self.dist_dir).glob("*.editable-*.whl"):
            with zipfile.ZipFile(wheel, "a") as zf:
                zf.writestr(PTH_NAME, pth_text())
