"""The KL driver's only binding to `replayssm_eval.models`: load a model and run state-carrying streams.

The driver needs:

    load_tokenizer(model) -> tokenizer           (before any model work, to check the text suffices)
    ssm_layout(model) -> (SSM layer indices, heads per layer)   from the model's config (`kl.sensitivity`)
    load_runner(model, device=, dtype=, backend=, device_map=, reference_scan=) -> Runner
    Runner.device                                where input token ids go
    Runner.check(config)                         ValueError if the model cannot run `config` (before any stream)
    Runner.open(config, seq_ids) -> Stream       one model state (SSM, conv, KV) in one ReplayConfig
    Runner.restore(config, seq_ids, saved) -> Stream   a stream continuing from `Stream.save()`
    Runner.state_traffic(config) -> dict | None  SSM state bytes per decode token (models.traffic)
    Runner.skip_reads(config) -> dict | None     the checkpoint reads #skip dropped in the closed streams of
                                                 `config`, per layer and in total, and the bytes they save
    Runner.reference_checks -> dict              per SSM layer, the differences between our kernels and HF's
                                                 FP32 scan on the layer's first segment in this process (empty
                                                 under reference_scan="hf"; `ReplaySession.reference_checks`)
    Runner.on_layer                              None, or fn(fraction) called during a forward with the
                                                 fraction of it done (after each decoder layer): the
                                                 progress bar's steps within a segment
    Stream.prefill(tokens [B, P]) -> logits [B, 1, V] of the last prompt token (anchors the window)
    Stream.extend(tokens [B, S]) -> logits [B, S, V], continuing from the carried state
    Stream.save() -> object                      the carried state, for torch.save (Ctrl-C snapshots)
    Stream.close()                               frees the state

Several streams of one runner are alive at once (the reference and every config, in lockstep).
Here a stream is a `ReplaySession` (its own HF cache and SSM states) of one `ReplayModel`.
Tests replace `load_tokenizer` and `load_runner` with a fake (tests/helpers/kl_fakes.py).
"""

from __future__ import annotations

import torch

from replayssm_eval.replay.config import ReplayConfig


def load_tokenizer(model: str):
    """The tokenizer of `model` (bundled fixture name, local directory or hub id)."""
    from transformers import AutoTokenizer

    path = _resolve(model)  # fails at once for a name that cannot load
    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as err:
        raise ValueError(
            f"unknown model {model!r}: not a bundled fixture, a local model directory or a reachable hub id ({err})"
        ) from err


def ssm_layout(model: str) -> tuple[list[int], int]:
    """(HF indices of the SSM layers, heads per SSM layer) of `model`, from its config alone (no weights)."""
    from transformers import AutoConfig

    from replayssm_eval.models.presets import geometry_from_config, ssm_layer_indices

    config = AutoConfig.from_pretrained(_resolve(model))
    return ssm_layer_indices(config), geometry_from_config(config).num_heads


def load_runner(model: str, *, device: str, dtype: str, backend: str, device_map: str | None,
                reference_scan: str = "hf") -> "ModelRunner":
    """`model` loaded through replayssm_eval.models, with its SSM layers on the ReplaySSM kernels."""
    from replayssm_eval.models import load_model

    replay_model = load_model(model, dtype=dtype, device=device, device_map=device_map, backend=backend)
    return ModelRunner(replay_model, reference_scan)


class ModelRunner:
    """A `ReplayModel`; each stream is a new session of it."""

    def __init__(self, replay_model, reference_scan: str = "hf"):
        self.replay_model, self.reference_scan = replay_model, reference_scan
        self.device = replay_model.model.device
        self.skips: dict[str, dict[int, list[int]]] = {}  # config name -> layer -> session.skip_counts sums
        self.on_layer = None
        layers = replay_model.model.base_model.layers
        for i, layer in enumerate(layers):  # observes only: the outputs are left as they are
            layer.register_forward_hook(lambda module, args, output, done=(i + 1) / len(layers): self._layer_done(done))

    def _layer_done(self, fraction: float) -> None:
        if self.on_layer is not None:
            self.on_layer(fraction)

    @property
    def reference_checks(self) -> dict[int, dict[str, float]]:
        """The kernel reference's checks against HF's scan, filled by the sessions (each layer once)."""
        return self.replay_model.reference_checks

    def check(self, config: ReplayConfig) -> None:
        self.replay_model.check_config(config)

    def open(self, config: ReplayConfig, seq_ids: torch.Tensor) -> "ModelStream":
        return ModelStream(self, self.replay_model.new_session(config, seq_ids=seq_ids,
                                                               reference_scan=self.reference_scan))

    def restore(self, config: ReplayConfig, seq_ids: torch.Tensor, saved: dict) -> "ModelStream":
        """A session like `open`'s that adopts the saved HF cache and continues the saved SSM states."""
        session = self.replay_model.new_session(config, seq_ids=seq_ids, reference_scan=self.reference_scan)
        session.continue_from(saved)
        return ModelStream(self, session)

    def state_traffic(self, config: ReplayConfig) -> dict | None:
        """`models.state_traffic` of this model's SSM geometry; None for a speculative schedule (not modelled)."""
        from replayssm_eval.models import state_traffic

        if config.speculative is not None:
            return None
        return state_traffic(self.replay_model.model.config, config)

    def skip_reads(self, config: ReplayConfig) -> dict | None:
        """`models.traffic.skip_savings` of the checkpoint reads `#skip` dropped in the closed streams of `config`
        ((token, head) pairs of the decode calls; a stream restored from a snapshot counts from there); None
        without #skip in any part."""
        from replayssm_eval.models.traffic import skip_savings

        if all(part.skip_read_below is None for part in config.part_configs):
            return None
        layers = self.skips.get(config.name, {})
        counts = {layer: dict(zip(("reads", "skipped_read_copy", "skipped_recur_copy"), c))
                  for layer, c in sorted(layers.items())}
        return skip_savings(self.state_traffic(config), counts)

    def _add_skips(self, session) -> None:
        totals = self.skips.setdefault(session.config.name, {})
        for layer, counts in session.skip_counts.items():
            totals[layer] = [a + b for a, b in zip(totals.get(layer, [0, 0, 0]), counts)]


class ModelStream:
    def __init__(self, runner: ModelRunner, session):
        self.runner, self.replay_model, self.session = runner, runner.replay_model, session

    def prefill(self, tokens: torch.Tensor) -> torch.Tensor:
        """The first call of a session is the prompt; only its last logits are kept."""
        return self.replay_model.forward(tokens, self.session, logits_to_keep=1)  # [B, 1, V]

    def extend(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.replay_model.forward(tokens, self.session)  # [B, S, V]

    def save(self) -> dict:
        """The session's carried state (references, not copies): HF cache, SSM states, tokens fed, mask."""
        return self.session.carried()

    def close(self) -> None:
        self.runner._add_skips(self.session)
        self.session = None  # drops the HF cache and the SSM states


def _resolve(model: str) -> str:
    """A bundled fixture's directory, else `model` unchanged."""
    from replayssm_eval.models.fixtures import resolve_model

    return str(resolve_model(model))
