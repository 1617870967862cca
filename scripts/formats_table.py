"""Print the BENCHMARKS.md formats table (Markdown) of KL runs: `reports.tables.formats_table`.

    python scripts/formats_table.py RUN_DIR [RUN_DIR ...]     # kl run directories (or folders holding them)
"""

import sys
from pathlib import Path

from replayssm_eval.reports.load import load_results
from replayssm_eval.reports.render import _md_table
from replayssm_eval.reports.tables import formats_table


def main(paths: list[str]) -> int:
    if not paths:
        print(__doc__, file=sys.stderr)
        return 2
    kl = [r for r in load_results([Path(p) for p in paths]) if r.kind == "kl"]
    if not kl:
        print(f"no kl.json under {', '.join(paths)}", file=sys.stderr)
        return 1
    print("\n".join(_md_table(formats_table(kl))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
