"""ReplaySSM split-precision kernels, one folder per recurrence family.

`mamba2/`, `gdn/` and `kda/` (with `delta/`, the delta-rule code GDN and KDA share) each hold a
step-by-step `decode_reference`, a teacher-forced `chunked` form and Triton kernels. `family`
describes each family (`KernelFamily`) for the code outside `kernels/`: `get_family(name)`;
`static_step` runs any family's fixed-buffer decode step. What the kernels store and when
(ReplayConfig, schedules, keys, ReplayState) is `replayssm_eval.replay`.
"""
