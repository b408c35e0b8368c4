"""The `aepo` command: train | sft | eval | compare | rollout | probe | verl-data | serve-search | report | config.

Every command that builds a config takes ``--preset``, ``--config FILE.yaml`` and dotted
overrides (``aepo train algorithm.clip_ratio_high=0.28 rollout.n=8``). Subcommands import
their modules lazily so that ``aepo config show`` stays instant.

``--plugin MODULE_OR_FILE.py`` (repeatable, before or after the subcommand) imports your own
losses, estimators, tools, tasks, rewards or engines before the config is validated, as do the
modules of the ``aepo_rl.plugins`` entry-point group (``docs/extending.md``).

A mistake in what the user gave (:class:`aepo_rl.errors.UserError`, or a disk-full / permission /
missing-path OSError) prints one line naming the file, line or key and the fix, and exits with
status 2; any other exception is an internal error (status 1) whose traceback ``--debug`` (or the
environment variable ``AEPO_DEBUG=1``) shows.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from aepo_rl import __version__
from aepo_rl.config import PRESETS, Config, ConfigError, load_config, parse_overrides, set_key
from aepo_rl.errors import UserError, check_writable, import_extra, os_error_message
from aepo_rl.registry import load_plugins


def _config_args(parser: argparse.ArgumentParser, default_preset: str = "aepo") -> None:
    parser.add_argument("--preset", default=default_preset, help=f"one of: {', '.join(PRESETS)}")
    parser.add_argument("--config", dest="config_file", default=None, help="YAML file of config sections")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rollout.n=8 trainer.steps=5")


def _config(args: argparse.Namespace, extra: dict | None = None):
    extra = dict(extra or {})
    if getattr(args, "sft_data", None):  # --data of `aepo sft`, --sft-data of `aepo train`: sft.data
        extra["sft.data"] = json.dumps(args.sft_data)
    overrides = list(args.overrides)
    return load_config(args.preset, args.config_file, [f"{k}={v}" for k, v in (extra or {}).items()] + overrides)


def _check_out(out: str | None, cfg) -> None:
    """Fail now, not after the work, when the output folder (``--out``, else under trainer.run_dir) is unwritable."""
    if out:
        check_writable(out, "--out")
    else:
        check_writable(cfg.trainer.run_dir, "trainer.run_dir")


def cmd_train(args: argparse.Namespace) -> int:
    # The config is checked before aepo_rl.api imports torch and transformers: a wrong key fails at once.
    if args.resume:
        if args.config_file or args.preset != "aepo":
            raise ConfigError("--resume continues a run with its own config.yaml and preset; drop --preset and "
                              "--config (overrides of steps, evaluation and logging settings are accepted)")
        if args.sft_data:
            raise ConfigError("--sft-data starts a run; --resume continues one with its own SFT model")
        check_writable(args.resume, "--resume")
        overrides = parse_overrides(args.overrides)
        for key, value in overrides.items():
            set_key(Config(), key, value)  # an unknown key or a wrong type; the run's own checks come later
        from aepo_rl.api import train_main

        return train_main(None, resume=args.resume, overrides=overrides)
    cfg = _config(args)
    check_writable(cfg.trainer.run_dir, "trainer.run_dir")
    from aepo_rl.api import train_main

    return train_main(cfg)


def cmd_sft(args: argparse.Namespace) -> int:
    cfg = _config(args)
    _check_out(args.out, cfg)
    from aepo_rl.train.sft import sft_main

    return sft_main(cfg, out_dir=args.out)


def cmd_eval(args: argparse.Namespace) -> int:
    extra = {"eval.samples": args.samples} if args.samples is not None else {}
    if args.task:
        extra["task.name"] = args.task
    if args.greedy:
        extra["eval.greedy"] = "true"
    if args.model:
        extra["model.path"] = args.model
    cfg = _config(args, extra)
    from aepo_rl.evaluate import eval_main

    return eval_main(cfg, out_file=args.out, endpoint=args.endpoint,
                     endpoint_model=args.endpoint_model)


def cmd_compare(args: argparse.Namespace) -> int:
    from aepo_rl.compare import Arm, compare_main, parse_arm, parse_presets

    named = [parse_arm(text, args.seeds) for text in args.arm or []]
    presets = args.presets if args.presets is not None else ("" if named else "grpo,arpo,aepo")
    arms = [Arm(name, name, {}, runs) for name, runs in (parse_presets(presets, args.seeds) if presets else {}).items()]
    cfg = _config(args)
    _check_out(args.out, cfg)
    return compare_main(cfg, presets=arms + named, seeds=args.seeds, steps=args.steps, out_dir=args.out,
                        reference=args.reference, table_only=args.table_only)


def cmd_rollout(args: argparse.Namespace) -> int:
    extra = {"task.name": args.task} if args.task else {}
    if args.model:
        extra["model.path"] = args.model
    cfg = _config(args, extra)
    check_writable(args.out, "--out")
    from aepo_rl.rollout.cli import rollout_main
    from aepo_rl.train.checkpoint import find_trained_model

    found = None
    if cfg.model.path is None and cfg.model.init is None:  # random weights would give flat trees: a trained model?
        found = find_trained_model(cfg.trainer.run_dir, cfg.task.name)
        if found is not None:
            cfg.model.path = str(found)
    return rollout_main(cfg, num_prompts=args.num_prompts, out_dir=args.out,
                        random_model=cfg.model.path is None and cfg.model.init is None, found_model=found)


def cmd_probe(args: argparse.Namespace) -> int:
    from aepo_rl.probes import ProbeOptions, probe_main

    extra = {"task.name": args.task} if args.task else {}
    if args.model:
        extra["model.path"] = args.model
    cfg = _config(args, extra)
    options = ProbeOptions(prompts=args.prompts, batches=args.batches, seeds=args.seeds, split=args.split,
                           penalty=args.penalty, n=args.n, global_samples=args.global_samples, children=args.children,
                           stale_steps=args.stale_steps)
    return probe_main(args.probe, cfg, options, out_file=args.out)


def cmd_verl_data(args: argparse.Namespace) -> int:
    cfg = _config(args, {"task.name": args.task} if args.task else {})
    check_writable(args.out, "--out")
    from aepo_rl.integrations.verl.data import verl_data_main

    return verl_data_main(cfg, args.out)


def cmd_serve_search(args: argparse.Namespace) -> int:
    for module in ("fastapi", "uvicorn"):
        import_extra(module, "server", "aepo serve-search")
    from aepo_rl.tools.server import serve_main

    return serve_main(corpus=args.corpus, host=args.host, port=args.port, topk=args.topk, seed=args.seed)


def cmd_report(args: argparse.Namespace) -> int:
    from aepo_rl.report import report_main

    if args.out:
        check_writable(args.out, "--out")
    probe_files = [path for path in args.runs if path.endswith(".json")]
    if probe_files and len(probe_files) < len(args.runs):
        print("aepo report: error: give run folders or `aepo probe --out` JSON files, not both "
              f"({len(probe_files)} .json of {len(args.runs)})", file=sys.stderr)
        return 2
    if probe_files:
        from aepo_rl.probe_pool import pool_main

        return pool_main(probe_files, out_dir=args.out)
    return report_main(args.runs, out_dir=args.out)


def cmd_config(args: argparse.Namespace) -> int:
    from rich.table import Table

    from aepo_rl.config import describe, to_yaml
    from aepo_rl.progress import get_console

    if args.action == "docs":
        from aepo_rl.config_docs import reference_markdown, write_page

        if args.write:
            print(f"{args.write}: {'updated' if write_page(args.write) else 'up to date'}")
        else:
            print(reference_markdown(), end="")
        return 0
    cfg = _config(args)
    if args.yaml:
        print(to_yaml(cfg), end="")
        return 0
    table = Table(title=f"resolved config (preset {cfg.preset})")
    for column in ("key", "value", "meaning"):
        table.add_column(column, overflow="fold")
    for key, value, doc in describe(cfg):
        table.add_row(key, repr(value), doc)
    get_console().print(table)
    return 0


PLUGIN_HELP = ("import this module (my_pkg.my_loss) or .py file before the config is read, so the losses, "
               "estimators, tools, tasks, rewards and engines it registers can be named; repeatable")


DEBUG_HELP = "show the traceback of any error (as does the environment variable AEPO_DEBUG=1)"


def _count(minimum: int):
    """An argparse type: an integer >= ``minimum``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    parse.__name__ = f"integer >= {minimum}"  # argparse names the type in its messages
    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aepo", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"aepo {__version__}",
                        help="print the version of aepo-rl and exit")
    parser.add_argument("--plugin", dest="plugins", action="append", default=[], metavar="MODULE", help=PLUGIN_HELP)
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    # The same options after the subcommand: --plugin with its own dest, --debug set only when given,
    # since a subcommand's values replace the top level's.
    plugin = argparse.ArgumentParser(add_help=False)
    plugin.add_argument("--plugin", dest="command_plugins", action="append", default=[], metavar="MODULE",
                        help=PLUGIN_HELP)
    plugin.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", parents=[plugin],
                       help="the whole pipeline: tiny model, SFT, RL, before/after evaluation")
    _config_args(p)
    p.add_argument("--resume", default=None, metavar="RUN_DIR",
                   help="continue the run in this folder from its last complete step; overrides may change "
                        "trainer.steps, eval.* and the checkpoint and logging settings, nothing else")
    p.add_argument("--sft-data", dest="sft_data", action="append", default=[], metavar="FILE",
                   help="cold-start SFT on your demonstrations in this JSONL / JSON / parquet file (chat messages, "
                        "ShareGPT conversations or TRL prompt/completion rows) instead of the task's: sft.data; "
                        "repeatable")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("sft", parents=[plugin], help="cold-start SFT on the task's teacher demonstrations or yours")
    _config_args(p)
    p.add_argument("--data", dest="sft_data", action="append", default=[], metavar="FILE",
                   help="your demonstrations: a JSONL / JSON / parquet file of chat messages, ShareGPT conversations "
                        "or TRL prompt/completion rows (docs/training.md), instead of the task's: sft.data; repeatable")
    p.add_argument("--out", default=None, help="output folder (default runs/sft-<timestamp>)")
    p.set_defaults(func=cmd_sft)

    p = sub.add_parser("eval", parents=[plugin], help="pass@1 / pass@k of a model (or an OpenAI-compatible endpoint)")
    _config_args(p)
    p.add_argument("--model", default=None, help="Hugging Face model folder")
    p.add_argument("--task", default=None, help="task name (default: config task.name)")
    p.add_argument("--samples", type=_count(1), default=None, help="samples per question K (default eval.samples)")
    p.add_argument("--greedy", action="store_true", help="greedy decoding")
    p.add_argument("--out", default=None,
                   help="write the results as JSON here, and every sample to <out>.records.jsonl")
    p.add_argument("--endpoint", default=None, help="OpenAI-compatible base URL to evaluate instead of --model")
    p.add_argument("--endpoint-model", default=None, help="model name at --endpoint")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("compare", parents=[plugin],
                       help="several presets from one SFT checkpoint, several seeds, one table")
    _config_args(p)
    p.add_argument("--presets", default=None,
                   help="comma-separated presets to compare, each optionally with its own number of "
                        "seeds: grpo:5,arpo:5,dapo (default grpo,arpo,aepo when no --arm is given)")
    p.add_argument("--arm", action="append", metavar="'NAME=PRESET[:SEEDS] [KEY=VALUE ...]'",
                   help="an arm: a preset with its own overrides, e.g. --arm 'arpo_w0=arpo rollout.entropy_weight=0' "
                        "or --arm 'grpo_n6=grpo rollout.n=6' (repeatable; next to --presets)")
    p.add_argument("--seeds", type=_count(1), default=3,
                   help="RL runs per preset without its own count, seeds 0..N-1 (default 3)")
    p.add_argument("--steps", type=_count(0), default=None, help="RL steps per run (default trainer.steps)")
    p.add_argument("--table-only", action="store_true", help="train nothing: rebuild the table and plots of --out "
                   "from the runs finished so far (another process may still be running the rest)")
    p.add_argument("--reference", default=None, help="arm the paired differences are taken against "
                   "(default aepo when compared, else the first arm)")
    p.add_argument("--out", default=None,
                   help="output folder (default runs/compare-<timestamp>); run again with the same folder to "
                        "finish an interrupted comparison")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("rollout", parents=[plugin], help="run one tree rollout and print each prompt's tree")
    _config_args(p)
    p.add_argument("--task", default=None, help="task name (default: config task.name, synthetic)")
    p.add_argument("--num-prompts", type=_count(1), default=2, help="training prompts to roll out (default 2)")
    p.add_argument("--out", default="runs/rollout", help="folder of rollouts.jsonl (default runs/rollout)")
    p.add_argument("--model", default=None, help="Hugging Face model folder (default: a tiny random model)")
    p.set_defaults(func=cmd_rollout)

    from aepo_rl.probe_options import PROBES, ProbeOptions

    defaults = ProbeOptions()
    p = sub.add_parser("probe", parents=[plugin], help="measure one AEPO mechanism on a checkpoint, paired, with 95%% "
                       "intervals (docs/mechanisms.md)")
    p.add_argument("probe", choices=PROBES, help="the mechanism: " + ", ".join(PROBES))
    _config_args(p)
    p.add_argument("--model", default=None, help="Hugging Face model folder (default model.path: the tiny model)")
    p.add_argument("--task", default=None, help="task name (default: config task.name)")
    p.add_argument("--prompts", type=_count(1), default=defaults.prompts,
                   help=f"prompts to probe (default {defaults.prompts})")
    p.add_argument("--batches", type=_count(1), default=defaults.batches,
                   help=f"clip-gradient: RL batches of trainer.batch_size prompts (default {defaults.batches})")
    p.add_argument("--seeds", type=_count(1), default=defaults.seeds,
                   help=f"rollout seeds per prompt, from rollout.seed on (default {defaults.seeds})")
    p.add_argument("--split", default=defaults.split,
                   help=f"the task split the prompts come from (default {defaults.split})")
    p.add_argument("--penalty", type=float, default=None,
                   help="branch-penalty: λ of the penalised arm, against λ = 0 (default rollout.branch_penalty)")
    p.add_argument("--n", type=_count(2), default=defaults.n,
                   help=f"branch-penalty: trajectories per tree (default {defaults.n})")
    p.add_argument("--global-samples", type=_count(1), default=defaults.global_samples,
                   help=f"branch-penalty: global samples per tree (default {defaults.global_samples})")
    p.add_argument("--children", type=_count(1), default=defaults.children,
                   help=f"fork-choice: children per fork point (default {defaults.children})")
    p.add_argument("--stale-steps", type=_count(1), default=defaults.stale_steps,
                   help="clip-gradient: optimizer steps between π_old and the "
                        f"probed policy (default {defaults.stale_steps})")
    p.add_argument("--out", default=None, help="write the result, with every unit's raw values, as JSON here")
    p.set_defaults(func=cmd_probe)

    p = sub.add_parser("verl-data", parents=[plugin], help="a task's train/val splits as verl parquet (docs/verl.md)")
    _config_args(p)
    p.add_argument("--task", default=None, help="task name (default: config task.name, synthetic)")
    p.add_argument("--out", required=True, help="folder for train.parquet and val.parquet")
    p.set_defaults(func=cmd_verl_data)

    p = sub.add_parser("serve-search", parents=[plugin], help="BM25 search server speaking Search-R1's /retrieve API")
    p.add_argument("--corpus", default="synthetic",
                   help="a JSONL corpus file, a registered corpus name ('synthetic' or a plugin's, docs/extending.md) "
                        "or 'wiki'")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1, this machine only)")
    p.add_argument("--port", type=_count(0), default=8000, help="port to listen on (default 8000)")
    p.add_argument("--topk", type=_count(1), default=3,
                   help="results per query when the request does not say (default 3)")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic corpus")
    p.set_defaults(func=cmd_serve_search)

    p = sub.add_parser("report", parents=[plugin], help="plots and tables from run folders, or one table of "
                       "`aepo probe --out` files pooled over checkpoints")
    p.add_argument("runs", nargs="+", help="run folders made by aepo train or aepo compare, or JSON files written by "
                                           "aepo probe --out (docs/mechanisms.md)")
    p.add_argument("--out", default=None, help="output folder (default <first run>/plots; probe files: "
                                               "probes.json there, only when given)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("config", parents=[plugin],
                       help="show the resolved config, or print the Markdown reference of every key")
    p.add_argument("action", choices=["show", "docs"],
                   help="show: the resolved config; docs: the reference of the defaults")
    _config_args(p)
    p.add_argument("--yaml", action="store_true", help="show: print YAML instead of a table")
    p.add_argument("--write", default=None, metavar="PAGE.md",
                   help="docs: replace the generated part of this page (docs/configuration.md) instead of printing")
    p.set_defaults(func=cmd_config)
    return parser


def sleeping_openmp_threads() -> None:
    """Make torch's idle OpenMP threads sleep rather than spin (``OMP_WAIT_POLICY=PASSIVE``), unless the
    environment already names a policy.

    By default torch's CPU threads spin between parallel regions. On a machine that other jobs share,
    the spinning threads take turns on the cores away from the threads with work, and a run slows far
    more than its share of the machine would explain; sleeping threads cost a little on a quiet machine
    (measured in lab/notebook.md, explained in docs/training.md#cpu-threads-on-a-shared-machine). Only
    takes effect before torch is imported, which the command line defers until after this call. The
    numbers a run computes do not change.
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def main(argv: list[str] | None = None) -> int:
    sleeping_openmp_threads()
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    unknown = [item for item in extra if "=" not in item or item.startswith("-")]
    if unknown or (extra and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(unknown or extra)}")
    if extra:
        args.overrides = list(args.overrides) + extra
    debug = args.debug or os.environ.get("AEPO_DEBUG", "") not in ("", "0")
    try:
        load_plugins(args.plugins + args.command_plugins)
        return int(args.func(args) or 0)
    except Exception as err:
        if debug:
            raise
        return report_error(err)


def report_error(err: Exception) -> int:
    """Print ``err`` as one line on stderr; the exit status: 2 for a user's mistake, 1 for an internal error."""
    if isinstance(err, UserError):
        kind = "config error: " if isinstance(err, ConfigError) else ""
        print(f"aepo: {kind}{err}", file=sys.stderr)
        return 2
    message = os_error_message(err) if isinstance(err, OSError) else None
    if message is not None:
        print(f"aepo: {message}", file=sys.stderr)
        return 2
    print(f"aepo: internal error: {type(err).__name__}: {err}\n"
          "aepo: run again with --debug (or AEPO_DEBUG=1) for the traceback", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
