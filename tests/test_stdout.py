"""`-o -`: fd 1 belongs to the records. A user's print(), or a library writing to fd 1, goes to stderr."""

from __future__ import annotations

import json

from .conftest import TOKENIZER, run_process


def test_prints_of_a_users_reward_never_land_in_the_record_stream(sim, problems, tmp_path):
    chatty = tmp_path / "chatty.py"
    chatty.write_text(
        "import os\n\ndef reward(request):\n    print('scoring', request.problem_id)\n"
        "    os.write(1, b'raw bytes on fd 1\\n')\n    return 1.0\n"
    )
    proc = run_process(
        "generate",
        str(problems),
        "-o",
        "-",
        "--base-url",
        sim.url,
        "--tokenizer",
        TOKENIZER,
        "--reward",
        f"{chatty}:reward",
        "--num-parallel",
        "2",
    )
    assert proc.returncode == 0, proc.stderr.decode()
    lines = proc.stdout.splitlines()
    records = [json.loads(line) for line in lines]  # every line is a record: nothing else came through
    assert records and {r["problem_id"] for r in records} == {f"p{i:03d}" for i in range(8)}
    assert b"scoring p000" in proc.stderr and b"raw bytes on fd 1" in proc.stderr
