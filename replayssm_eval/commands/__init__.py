"""The `replayssm-eval` subcommands, one module each: its usage, its options dataclass (or the driver's) and the
`@cli.command` function that runs it. Only these modules import `cli`.

    formats    bits, bytes and round-trip error of the state formats
    kl         teacher-forced KL against the FP32 state (`kl.driver`)
    sensitivity  per-layer and per-head KL of one config, mixed precision under a byte budget (`kl.sensitivity`)
    accuracy   downstream accuracy against FP32 (`accuracy.driver`)
    regress    the numerics regression suite, or an external kernel's conformance (`regress`)
    report     HTML and Markdown from result JSON (`reports`)
"""
