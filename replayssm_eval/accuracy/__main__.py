"""lm-eval's own command line with the `replayssm` model registered and this package's tasks on the include path.

    python -m replayssm_eval.accuracy --model replayssm --model_args pretrained=tiny-nemotron-h,read=nvfp4,recur=fp16sr \
        --tasks replayssm_gpqa_diamond_local --limit 4 --log_samples --output_path out/

The installed package registers "replayssm" with the plain `lm_eval` script too (`lm_eval_plugin`,
a .pth hook, since lm-eval 0.4.13 reads no plugin entry points); this runs that same script after
importing the model, so it works without the hook as well (a checkout on PYTHONPATH), and adds our
task folder. Every argument is lm-eval's; `--include_path` defaults to `replayssm_eval/accuracy/yaml`.
A bad `replayssm` model arg ends in one line and exit status 2 (lm-eval's own script shows it as a traceback:
its `cli_evaluate` handles no exception).
"""

import sys

from lm_eval.__main__ import cli_evaluate

from replayssm_eval.accuracy import YAML_DIR
from replayssm_eval.accuracy.lm_model import ModelArgsError  # the import registers "replayssm"

if not any(arg.split("=")[0] == "--include_path" for arg in sys.argv[1:]) and sys.argv[1:2] not in (["-h"], ["--help"]):
    sys.argv += ["--include_path", str(YAML_DIR)]
try:
    cli_evaluate()
except ModelArgsError as err:
    print(f"error: {err}", file=sys.stderr)
    sys.exit(2)
