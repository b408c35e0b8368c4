"""PhantomWiki's universes, its teacher and its lengths, for choosing settings (docs/tasks-and-rewards.md).

For the task of the given overrides (``task.name=phantomwiki`` is implied) this prints, per split: the
questions by difficulty, the articles' lengths against ``task.search_max_chars``; the teacher's EM when it
follows every question's chain through the split's own search tool with no limit on searches (the fact at
every hop visible in the results, every answer found), the share it answers within
``task.phantomwiki_max_searches``, and why the others fail; then the demonstrations' lengths in tokens of the
tiny tokenizer the task trains (``task.texts()``), the longest tool result and prompt, and the tokens of the
training and the held-out universes' names.

    python benchmarks/phantomwiki_teacher.py [overrides, e.g. task.search_topk=3 task.search_max_chars=400]
"""

from __future__ import annotations

import collections
import statistics
import sys
import time

from aepo_rl.config import load_config
from aepo_rl.models import encode_prompt, train_tiny_tokenizer
from aepo_rl.rewards import answer_list_scores
from aepo_rl.tasks import get_task
from aepo_rl.tasks.phantomwiki import SPLITS


def quantiles(values: list[int]) -> str:
    values = sorted(values)
    pick = lambda q: values[min(len(values) - 1, int(q * len(values)))]  # noqa: E731
    return f"median {pick(0.5)}, p90 {pick(0.9)}, p99 {pick(0.99)}, max {values[-1]}"


def main(argv: list[str]) -> None:
    overrides = {"task.name": "phantomwiki", **dict(a.split("=", 1) for a in argv)}
    cfg = load_config("aepo", None, overrides)
    start = time.perf_counter()
    task = get_task(cfg)
    print(f"task ready in {time.perf_counter() - start:.1f} s; overrides {overrides}")
    for split in SPLITS:
        examples, docs = task.examples(split), task.corpus(split)
        over = sum(len(d["text"]) > cfg.task.search_max_chars for d in docs)
        difficulty = sorted(collections.Counter(e.extra_info["difficulty"] for e in examples).items())
        print(f"\n{split}: {len(examples)} questions (difficulty: count {difficulty}; single answer "
              f"{sum(len(e.answers) == 1 for e in examples)}), {len(docs)} articles of "
              f"{quantiles([len(d['text']) for d in docs])} characters, {over} over search_max_chars")
        em, within, searches, failures = [], 0, [], collections.Counter()
        levels = collections.defaultdict(list)
        for example in examples:
            solution = task.teacher_solution(example, split)
            score = answer_list_scores(solution.answer, example.answers)["em"] if solution else 0.0
            em.append(score)
            levels[example.extra_info["difficulty"]].append(score)
            if solution is None:
                failures["chain not followed (a derived relation, a page not in its search's results, "
                         "or no one at a hop)"] += 1
                continue
            searches.append(len(solution.queries))
            if score < 1:
                failures["an answer missing or extra (more people share a value than the search shows, "
                         "or a cut value)"] += 1
            elif len(solution.queries) <= cfg.task.phantomwiki_max_searches:
                within += 1
        by_level = ", ".join(f"{level}: {statistics.mean(s):.3f}" for level, s in sorted(levels.items()))
        print(f"  teacher EM {statistics.mean(em):.3f} (by difficulty {by_level}); correct within "
              f"{cfg.task.phantomwiki_max_searches} searches {within / len(examples):.3f}; searches per followed chain "
              f"{quantiles(searches)}; failures {dict(failures)}")
    tokenizer = train_tiny_tokenizer(task.texts(), cfg.model.tiny_vocab_size)
    demos = task.demonstrations()
    lengths = [len(tokenizer("".join(text for text, _ in d.pieces))["input_ids"]) for d in demos]
    results = [len(tokenizer(text)["input_ids"]) for d in demos for text, trained in d.pieces if not trained]
    prompts = [len(encode_prompt(tokenizer, e.messages)) for s in SPLITS for e in task.examples(s)]
    calls = collections.Counter(sum(1 for text, trained in d.pieces if trained and "<search>" in text) for d in demos)
    print(f"\n{len(demos)} demonstrations ({sum(d.has_error for d in demos)} with an error), "
          f"tokens {quantiles(lengths)}; "
          f"tool results {quantiles(results)}; prompts at most {max(prompts)}; searches per "
          f"demonstration {sorted(calls.items())}")
    for split in ("train", "test"):
        names = list(task.universes[split].facts)
        print(f"names of the {split} universe: "
              f"{statistics.mean(len(tokenizer(' ' + n)['input_ids']) for n in names):.2f} "
              f"tokens on average (with the leading space)")


if __name__ == "__main__":
    main(sys.argv[1:])
