"""benchmarks/ncu_stalls.py sums an Nsight Compute source page (the KDA fold's, stored with its BENCHMARKS row)."""

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "ncu_stalls.py"
SOURCE = ROOT / "reports" / "logs" / "ncu" / "fold_kda_source.csv.gz"


def _script():
    spec = importlib.util.spec_from_file_location("ncu_stalls", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_stall_shares_of_the_kda_fold(capsys):
    ncu_stalls = _script()
    df = ncu_stalls.load(str(SOURCE))
    assert len(df) == 1424 and int(df["samples"].sum()) == 88872
    assert df.loc[df["samples"].idxmax(), "op"] == "FMUL"
    predicated = df[df["Source"].str.contains("@P1   LDG.E.128", regex=False)]
    assert list(predicated["op"]) == ["LDG.E.128"]  # the predicate is not the opcode
    ncu_stalls.main([str(SOURCE), "--top", "3"])
    out = capsys.readouterr().out
    assert re.search(r"stall_long_sb\s+68\.7\n", out) and re.search(r"STS\.128\s+34\.8\n", out)


def test_a_page_without_samples_is_refused(tmp_path):
    page = tmp_path / "page.csv"
    page.write_text('"Kernel Name","k",\n"Address","Source"\n"0x0","NOP"\n')
    with pytest.raises(ValueError, match="Warp Stall Sampling"):
        _script().load(str(page))
