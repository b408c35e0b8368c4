"""Plots and final-value table from fake run folders."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.image
import pytest

from aepo_rl.report import (
    SMOOTH_WINDOW,
    MetricsError,
    pass1_halfwidth,
    plot_runs,
    read_metrics,
    read_run,
    report_main,
    series,
    trailing_mean,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def write_run(root, name, records, extra_lines=()):
    run = root / name
    run.mkdir(parents=True)
    lines = [json.dumps(r) for r in records] + list(extra_lines)
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return run


def full_record(step, scale=1.0):
    return {"step": step, "critic/score/mean": 0.1 * step * scale, "actor/entropy": 1.0 - 0.05 * step,
            "actor/pg_clipfrac": 0.01 * step, "actor/pg_clipfrac_lower": 0.002 * step,
            "rollout/branches_per_prompt": 2.0 + step, "rollout/largest_subtree_share": 0.5,
            "tool_call_counts/mean": 1.5, "response_length/mean": 100.0 + step}


def assert_valid_png(path):
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    height, width, channels = matplotlib.image.imread(path).shape
    assert height > 100 and width > 100 and channels in (3, 4)


def test_plot_runs_overlays_runs_and_skips_missing_panels(tmp_path, capsys):
    a = write_run(tmp_path, "aepo", [full_record(s) for s in range(1, 4)]
                  + [{"step": 3, "eval/synthetic/test/pass@1": 0.4, "eval_level/synthetic/test/hops=1/pass@1": 0.5}])
    b = write_run(tmp_path, "grpo",
                  [{"step": s, "critic/score/mean": 0.05 * s, "actor/entropy": 1.1} for s in range(1, 5)])
    written = plot_runs([a, b], tmp_path / "plots")
    names = sorted(p.name for p in written)
    assert names == sorted(["reward.png", "pass_at_1.png", "pass_at_1_by_level.png", "entropy.png", "clip_fraction.png",
                            "branching.png",
                            "tool_calls.png", "response_length.png"])
    for path in written:
        assert_valid_png(path)
    assert "skipped" not in capsys.readouterr().out

    written = plot_runs([b], tmp_path / "plots_b")
    assert sorted(p.name for p in written) == ["entropy.png", "reward.png"]
    out = capsys.readouterr().out
    assert "skipped pass_at_1.png: no run logged eval/*/pass@1" in out
    assert "skipped clip_fraction.png: no run logged actor/pg_clipfrac or actor/pg_clipfrac_lower" in out


def legends_of(monkeypatch) -> dict[str, list[str]]:
    """``{png name: legend texts}`` of every figure saved from now on."""
    from matplotlib.figure import Figure

    legends = {}
    original = Figure.savefig

    def spy(fig, path, **kwargs):
        legends[Path(path).name] = [t.get_text() for ax in fig.axes if ax.get_legend()
                                    for t in ax.get_legend().get_texts()]
        return original(fig, path, **kwargs)

    monkeypatch.setattr(Figure, "savefig", spy)
    return legends


def test_trailing_mean_by_hand():
    assert trailing_mean([1.0, 2.0, 3.0, 4.0, 5.0], 2) == [1.0, 1.5, 2.5, 3.5, 4.5]
    assert trailing_mean([3.0, 1.0, 2.0], 10) == [3.0, 2.0, 2.0]
    assert trailing_mean([], 5) == []


def test_long_noisy_series_get_a_trailing_mean_and_short_ones_do_not(tmp_path, monkeypatch):
    legends = legends_of(monkeypatch)
    long = write_run(tmp_path, "long", [{"step": s, "critic/score/mean": (-1) ** s * 0.5} for s in range(1, 41)])
    short = write_run(tmp_path, "short", [{"step": s, "critic/score/mean": 0.1 * s} for s in range(1, 5)])
    plot_runs([long, short], tmp_path / "plots")
    assert legends["reward.png"] == [f"long (mean of {SMOOTH_WINDOW} steps)", "short"]
    assert_valid_png(tmp_path / "plots" / "reward.png")


def test_read_metrics_sorts_merges_and_keeps_the_last_record_of_a_step(tmp_path):
    run = write_run(tmp_path, "r", [{"step": 2, "x": 2.0}, {"step": 1, "x": 1.0}, {"step": 2, "x": 5.0, "y": 1.0}],
                    extra_lines=["", "   "])
    records = read_metrics(run)
    assert records == [{"step": 1, "x": 1.0}, {"step": 2, "x": 5.0, "y": 1.0}]
    assert series(records, "x") == {"x": ([1, 2], [1.0, 5.0])}


def test_read_run_places_eval_json_before_and_after_rl(tmp_path):
    run = write_run(tmp_path, "r", [{"step": 1, "x": 1.0}, {"step": 4, "x": 2.0, "eval/t/test/pass@1": 0.3}])
    (run / "eval.json").write_text(json.dumps({"sft": {"t/test": {"pass@1": 0.25, "pass@k": 0.5}},
                                               "rl": {"t/test": {"pass@1": 0.5, "pass@k": 0.75}}}))
    assert read_run(run) == [{"step": 0, "eval/t/test/pass@1": 0.25}, {"step": 1, "x": 1.0},
                             {"step": 4, "x": 2.0, "eval/t/test/pass@1": 0.5}]
    (run / "eval.json").write_text('{"rl": [0.5]}')
    with pytest.raises(MetricsError, match=r"r/eval\.json: expected \{\"rl\""):
        read_run(run)
    (run / "eval.json").write_text('{"rl": ')
    with pytest.raises(MetricsError, match=r"r/eval\.json: not valid JSON"):
        read_run(run)


def test_series_matches_patterns_and_drops_non_numbers():
    records = [{"step": 1, "eval/a/test/pass@1": 0.5, "eval/b/dev/pass@1": 0.25, "eval/a/test/pass@k": 0.9},
               {"step": 2, "eval/a/test/pass@1": float("nan"), "eval/b/dev/pass@1": None},
               {"step": 3, "eval/a/test/pass@1": True, "eval/b/dev/pass@1": 0.5}]
    assert series(records, "eval/*/pass@1") == {"eval/a/test/pass@1": ([1], [0.5]),
                                               "eval/b/dev/pass@1": ([1, 3], [0.25, 0.5])}


@pytest.mark.parametrize("bad_line, message", [
    ('{"step": 3, "x": ', r"metrics\.jsonl:3: not valid JSON"),
    ("[1, 2]", r"metrics\.jsonl:3: expected a JSON object, got list"),
    ('{"x": 1.0}', r"metrics\.jsonl:3: missing integer 'step' field \(got None\)"),
    ('{"step": "4"}', r"metrics\.jsonl:3: missing integer 'step' field \(got '4'\)"),
])
def test_malformed_metrics_line_names_file_and_line(tmp_path, bad_line, message):
    run = write_run(tmp_path, "bad", [{"step": 1}, {"step": 2}], extra_lines=[bad_line])
    with pytest.raises(MetricsError, match=message) as info:
        read_metrics(run)
    assert str(run / "metrics.jsonl") in str(info.value)


def test_missing_run_folder_and_missing_metrics_file(tmp_path):
    with pytest.raises(MetricsError, match=f"run folder {tmp_path / 'nope'} does not exist"):
        read_metrics(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(MetricsError, match=r"empty/metrics\.jsonl does not exist"):
        read_metrics(tmp_path / "empty")


def test_report_main_prints_final_values_and_writes_plots(tmp_path, capsys):
    a = write_run(tmp_path, "aepo", [full_record(s) for s in range(1, 4)])
    b = write_run(tmp_path, "arpo", [full_record(s, scale=2.0) for s in range(1, 3)])
    assert report_main([str(a), str(b)]) == 0
    assert_valid_png(a / "plots" / "reward.png")
    out = capsys.readouterr().out
    assert "final values" in out and "critic/score/mean" in out
    cells = [[c.strip() for c in line.replace("┃", "│").split("│")[1:-1]] for line in out.splitlines()
             if line.replace("┃", "│").count("│") == 4]
    rows = {c[0]: c[1:] for c in cells}
    assert rows["metric"] == ["aepo", "arpo"]
    assert rows["last step"] == ["3", "2"]
    assert rows["critic/score/mean"] == ["0.3", "0.4"]
    assert rows["actor/entropy"] == ["0.85", "0.9"]
    assert rows["response_length/mean"] == ["103", "102"]
    assert rows["rollout/branches_per_prompt"] == ["5", "4"]


def test_report_main_reports_errors_naming_the_file(tmp_path, capsys):
    run = write_run(tmp_path, "bad", [{"step": 1}], extra_lines=["not json"])
    assert report_main([str(run)], out_dir=str(tmp_path / "p")) == 2
    assert f"aepo report: error: {run / 'metrics.jsonl'}:2: not valid JSON" in capsys.readouterr().out
    assert report_main([str(tmp_path / "missing")]) == 2
    assert f"run folder {tmp_path / 'missing'} does not exist" in capsys.readouterr().out


def test_aepo_report_command(tmp_path):
    from aepo_rl.cli import main

    run = write_run(tmp_path, "r", [full_record(s) for s in range(1, 3)])
    assert main(["report", str(run), "--out", str(tmp_path / "figs")]) == 0
    assert_valid_png(tmp_path / "figs" / "tool_calls.png")


def test_pass1_is_drawn_with_its_question_count_and_a_95_percent_interval(tmp_path, monkeypatch):
    legends = legends_of(monkeypatch)
    run = write_run(tmp_path, "r", [{"step": 1, "x": 1.0}, {"step": 2, "eval/t/test/pass@1": 0.4}])
    (run / "eval.json").write_text(json.dumps({"sft": {"t/test": {"pass@1": 0.25, "num_questions": 64}},
                                               "rl": {"t/test": {"pass@1": 0.5, "num_questions": 64}}}))
    assert read_run(run)[0] == {"step": 0, "eval/t/test/pass@1": 0.25, "eval/t/test/num_questions": 64}
    plot_runs([run], tmp_path / "plots")
    assert legends["pass_at_1.png"] == ["r: eval/t/test/pass@1 (64 questions, 95% interval; 2 evaluations)"]
    assert pass1_halfwidth(0.5, 64) == pytest.approx(1.96 * 0.5 / 8)
    assert pass1_halfwidth(0.0, 64) == 0.0 and pass1_halfwidth(0.5, 0) == 0.0


def test_report_of_an_sft_folder(tmp_path, capsys, monkeypatch):
    """What `aepo sft --out runs/sft` writes: config, SFT metrics and the evaluation, no RL steps."""
    legends = legends_of(monkeypatch)
    run = tmp_path / "sft"
    (run / "checkpoints" / "sft").mkdir(parents=True)
    (run / "config.yaml").write_text("preset: aepo\n")
    (run / "sft_metrics.json").write_text(json.dumps({"loss_curve": [3.0, 2.0, 1.5], "final_loss": 1.5}))
    (run / "eval.json").write_text(json.dumps({"sft": {"synthetic/test": {"pass@1": 0.5, "pass@k": 0.75, "k": 4,
                                                                          "num_questions": 16}}}))
    assert report_main([str(run)]) == 0
    assert_valid_png(run / "plots" / "pass_at_1.png")
    assert_valid_png(run / "plots" / "sft_loss.png")
    assert legends["sft_loss.png"] == ["sft"]
    assert legends["pass_at_1.png"] == ["sft: eval/synthetic/test/pass@1 (16 questions, 95% interval; "
                                        "1 evaluation)"]
    out = capsys.readouterr().out
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in out.splitlines() if line.count("│") == 3}
    assert rows["eval/synthetic/test/pass@1"] == "0.5" and rows["last step"] == "0"


def test_a_few_evaluations_are_points_and_more_are_a_line(tmp_path, monkeypatch):
    """Two evaluations (before and after RL) joined by a line read as steady progress: they are drawn as points;
    with trainer.eval_every's evaluations between them the curve is joined."""
    from matplotlib.figure import Figure

    styles = {}
    original = Figure.savefig

    def spy(fig, path, **kwargs):
        if Path(path).name == "pass_at_1.png":
            styles[Path(path).parent.name] = [line.get_linestyle() for ax in fig.axes for line in ax.get_lines()
                                              if line.get_marker() == "o"]
        return original(fig, path, **kwargs)

    monkeypatch.setattr(Figure, "savefig", spy)
    for name, middle in (("two", []), ("five", [20, 40, 60])):
        run = write_run(tmp_path, name, [{"step": s, "x": 1.0, **({"eval/t/test/pass@1": 0.3 + s / 200}
                                                                  if s in middle else {})} for s in range(1, 81)])
        (run / "eval.json").write_text(json.dumps({"sft": {"t/test": {"pass@1": 0.25, "num_questions": 64}},
                                                   "rl": {"t/test": {"pass@1": 0.7, "num_questions": 64}}}))
        plot_runs([run], tmp_path / "plots" / name)
    assert styles == {"two": ["None"], "five": ["-"]}
