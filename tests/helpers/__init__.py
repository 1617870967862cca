"""Helpers shared by the test modules, one module a topic; test modules import from here, never from each other.

compare           assert_close, mostly_equal, assert_same_state, rel_err: tensors and replay states against a reference
replay            the config grid of the reference tests, stacking per-sequence states, moving a state to a device
mamba2, delta     each family's random inputs, token slicing, phased batches and naive recurrences
kernel_checks     the Triton kernels: no torch fallback, one segment per launch, in-kernel rounding
hf_tiny           tiny random-initialised Hugging Face models, one per supported model type
kl_fakes          a fake model for the KL driver
generation        the device under test and a mocked out-of-memory step for the generation engine
scoring           lm-eval helpers: a scripted model and `evaluate`
nvfp4             the golden NVFP4 tie rows
regress_adapters  sample (and deliberately broken) adapters for `regress --kernel`
reports           a KL report for the report renderers
"""
