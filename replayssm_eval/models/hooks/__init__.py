"""The replacements of the Hugging Face scan functions, one module per kernel family (each says why its functions
are the hook point): `REPLACEMENTS`, HF scan function name -> maker of its replacement. A model type's `scans`
(`models.model_types`) picks the pair it rebinds."""

from replayssm_eval.models.hooks import gdn, kda, mamba2

REPLACEMENTS = {**mamba2.REPLACEMENTS, **gdn.REPLACEMENTS, **kda.REPLACEMENTS}
