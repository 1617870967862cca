"""synth_sum's prompt: exactly what the small models are trained on."""

from replayssm_eval.accuracy.synthetic import prompt_and_target


def doc_to_text(doc: dict) -> str:
    return prompt_and_target("synth_sum", doc)[0]
