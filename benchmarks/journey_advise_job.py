"""Step 3 of results/journey/transcript.md: the Megatron line ``zeppelin advise`` printed (in
results/journey/03_advise.txt) as a job for scripts/slurm/check_megatron_args.py, its ``PREFIX``
replaced by an indexed dataset, parsed as tests/slurm/megatron_lines.py's ``job_from_line`` parses
the lines of tests/slurm/test_advise_megatron_lines.py. Run from the repository root:

    .venv/bin/python benchmarks/journey_advise_job.py results/journey/advise_job.json DATA_PREFIX
"""

import json
import sys

sys.path.insert(0, "tests/slurm")  # the tests' own parser, so this check is the tests' check
from megatron_lines import job_from_line  # noqa: E402


def main(argv) -> int:
    out, prefix = argv[1], argv[2]
    advise_output = argv[3] if len(argv) > 3 else "results/journey/03_advise.txt"
    with open(advise_output) as f:
        line = next(x.strip() for x in f if "torchrun" in x)
    with open(out, "w") as f:
        json.dump([job_from_line(line, "advise-journey", prefix)], f, indent=1)
    print(line.replace("PREFIX", prefix))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
