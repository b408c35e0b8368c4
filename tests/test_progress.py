"""Progress of long phases: plain, unwrapped lines when the output is not a terminal."""

from __future__ import annotations

import io

from rich.console import Console

from aepo_rl import progress
from aepo_rl.progress import PhaseProgress


def test_without_a_terminal_a_phase_prints_plain_lines_at_each_tenth_and_at_the_end():
    out = io.StringIO()
    with PhaseProgress("SFT", 20, console=Console(file=out, width=80)) as phase:
        for step in range(20):
            phase.advance(info=f"loss {1 / (step + 1):.3f}")
    lines = out.getvalue().splitlines()
    assert lines[0] == "SFT: 0/20 steps"
    assert len(lines) == 1 + 10  # one line per tenth, the last at 20/20
    assert lines[1].startswith("SFT: 2/20 steps, 0:00 elapsed, ETA ") and lines[1].endswith("loss 0.500")
    assert lines[-1].startswith("SFT: 20/20 steps") and "ETA" not in lines[-1]


def test_a_phase_prints_at_least_every_interval_and_says_where_it_stopped(monkeypatch):
    clock = iter(float(t) for t in range(0, 1000, 40))
    monkeypatch.setattr(progress.time, "perf_counter", lambda: next(clock))
    out = io.StringIO()
    with PhaseProgress("copy warm-up", 1000, console=Console(file=out, width=80)) as phase:
        phase.advance()  # 1/1000: no tenth crossed, but 40 s went by
        phase.advance()
    lines = out.getvalue().splitlines()
    assert lines[1].startswith("copy warm-up: 1/1000 steps, 0:40 elapsed, ETA ")
    assert lines[-1] == "copy warm-up: stopped at 2/1000 steps after 2:00"


def test_piped_output_is_not_wrapped(monkeypatch):
    out = io.StringIO()
    import rich

    monkeypatch.setattr(rich, "_console", Console(file=out))  # rich.get_console() returns this one
    console = progress.get_console()
    long_line = "step    1 | " + " | ".join(f"metric_{i} 0.123" for i in range(30))
    console.print(long_line)
    with PhaseProgress("RL", 3) as phase:
        phase.advance(info="x" * 200)
    text = out.getvalue()
    assert long_line + "\n" in text
    assert "RL: 1/3 steps" in text and "x" * 200 in text


def test_config_show_piped_keeps_every_key_on_one_line(capsys):
    from aepo_rl.cli import main
    from aepo_rl.config import describe, load_config

    assert main(["config", "show"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("│")]
    keys = [row.split("│")[1].strip() for row in rows]
    assert keys == [key for key, _, _ in describe(load_config())]
