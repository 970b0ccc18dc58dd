"""The Megatron command lines quoted in docs/ (``[ENV=V] torchrun ... SCRIPT.py|-m MODULE FLAGS``, e.g. the
advise examples of docs/dp.md) pass the same check as advise's own lines: Megatron-LM's parse_args +
validate_args + TransformerConfig, and the plugin's validation for a Zeppelin line, with the data
placeholder replaced by a real indexed dataset. Lines with an ellipsis or ``<...>`` are sketches,
not commands, and are left out."""

import glob
import os
import re

import pytest

from megatron_lines import check_jobs, job_from_line
from slurm_helpers import REPO, mlm_python_missing, write_documents

pytestmark = pytest.mark.slurm
LINE = re.compile(r"^\s*((?:[A-Z_]+=\S+\s+)*torchrun\s.*(?:\.py|-m \S+)\s.*)$")


def quoted_lines():
    """[(doc, line number, line, GPU arch)]: the arch from the line's --zeppelin-cluster or, for a
    stock line, the nearest cluster named above it (a800: 8, else 9)."""
    out = []
    for path in sorted(glob.glob(os.path.join(REPO, "docs", "*.md"))):
        with open(path) as f:
            text = f.read().splitlines()
        for i, line in enumerate(text):
            m = LINE.match(line)
            if not m or "..." in line or "<" in line:
                continue
            above = " ".join(text[max(0, i - 12):i + 1])
            arch = 8 if re.search(r"a800|A800", above) else 9
            out.append((os.path.relpath(path, REPO), i + 1, m.group(1), arch))
    return out


def test_docs_quote_megatron_lines():
    assert len([x for x in quoted_lines() if x[0] == os.path.join("docs", "dp.md")]) >= 6


def test_lines_quoted_in_docs_pass_megatron_and_the_plugin(tmp_path):
    why = mlm_python_missing()
    if why:
        pytest.skip(why)
    prefix = write_documents(str(tmp_path / "data" / "docs"))
    lines = quoted_lines()
    jobs = [job_from_line(line, f"doc{i}", prefix, arch) for i, (_, _, line, arch) in enumerate(lines)]
    results = check_jobs(jobs, tmp_path)
    status = [results[f"{j['name']}-{j['mode']}"] for j in jobs]
    failed = [f"{doc}:{n}: {r['error']}" for (doc, n, _, _), r in zip(lines, status) if not r["ok"]]
    assert not failed, "\n".join(failed)
