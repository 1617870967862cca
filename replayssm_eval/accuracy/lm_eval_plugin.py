"""Makes lm-eval 0.4.13 see this package's lm-eval models: `lm_eval --model replayssm` from any shell.

pyproject.toml declares the model the way lm-eval plugins do, an entry point in the group
`lm_eval.models` (`replayssm = "replayssm_eval.accuracy.lm_model:ReplaySSMLM"`). lm-eval releases
after 0.4.13 discover that group themselves; 0.4.13 reads no entry points: its registry holds its
own models (`lm_eval.models.MODEL_MAPPING`) and whatever was imported with `@register_model`, and
its `lm_eval` script imports nothing of ours. So the installed package also carries
`replayssm_eval_lm_eval.pth`, which Python runs at start-up: it executes this file in a namespace of
its own and calls `install()` (`lm_eval_plugin_build` writes it at install time: reinstall after
editing this file). `install` only puts a finder on `sys.meta_path`. When `lm_eval.models` is first
imported (lm-eval's `get_model` imports it before any lookup), the finder lets it load and then
registers each of our entry points not yet taken as lm-eval's own lazy placeholder, a
"module:Class" string: nothing of ours, nor torch, is imported until a run asks for the model, and
the class's `@register_model` then replaces the placeholder.

It runs in every interpreter of the environment: standard library only, nothing of this package
imported at start-up, and no error of ours ever raised into lm-eval.
"""

import sys

DIST = "replayssm-eval"
GROUP = "lm_eval.models"  # the entry-point group, named as lm-eval's later releases read it
TRIGGER = "lm_eval.models"  # the module whose import fills lm-eval's model registry


def register() -> list[str]:
    """Registers our `lm_eval.models` entry points that lm-eval's model registry lacks; returns their names."""
    from importlib.metadata import distributions

    from lm_eval.api.registry import model_registry

    added = []
    # every copy of our metadata on sys.path: a checkout's replayssm_eval.egg-info shadows the installed one there
    for ep in (ep for dist in distributions(name=DIST) for ep in dist.entry_points.select(group=GROUP)):
        if ep.name not in model_registry:
            # exactly "module:Class": 0.4.13 lets `@register_model` upgrade only that placeholder
            model_registry.register(ep.name, target=f"{ep.module}:{ep.attr}")
            added.append(ep.name)
    return added


def _register_quietly() -> None:
    try:
        register()
    except Exception as e:  # noqa: BLE001  a failure here must not break lm-eval's own models
        import warnings

        warnings.warn(f"{DIST} could not register its lm-eval models ({e!r}); `python -m replayssm_eval.accuracy` "
                      "registers them by import", stacklevel=2)


class RegisterAfterImport:
    """Meta path finder, first on `sys.meta_path`: once `lm_eval.models` has executed, registers our models (one shot)."""

    replayssm_lm_eval_hook = True  # how `install` recognises a finder from another exec of this file

    def find_spec(self, fullname, path=None, target=None):
        if fullname != TRIGGER:
            return None
        sys.meta_path.remove(self)  # once; and the lookup below must not come back here
        from importlib.util import find_spec

        spec = find_spec(fullname)  # what the other finders would have answered
        if spec is not None and hasattr(spec.loader, "exec_module"):
            exec_module = spec.loader.exec_module

            def exec_then_register(module):
                exec_module(module)
                _register_quietly()

            spec.loader.exec_module = exec_then_register
        return spec


def install() -> None:
    """Registers now if lm-eval's models are loaded, else right after they load; idempotent."""
    if TRIGGER in sys.modules:
        _register_quietly()
    elif not any(getattr(f, "replayssm_lm_eval_hook", False) for f in sys.meta_path):
        sys.meta_path.insert(0, RegisterAfterImport())  # before PathFinder, which would find lm_eval.models first
