"""Procedural reasoning tasks from ``reasoning-gym`` generators, solved with the python tool.

``task.name=reasoning_gym:<generator>`` (e.g. ``gsm_symbolic``, ``basic_arithmetic``,
``chain_sum``). Each split is its own generator seed, so splits are reproducible and
independent. The reward is the §3 format check (−1 on a format error) and otherwise the
generator's own answer checker, in [0, 1], on the ``\\boxed{}`` answer.
"""

from __future__ import annotations

from aepo_rl.config import TaskConfig
from aepo_rl.protocol import format_error
from aepo_rl.rewards import FORMAT_PENALTY, extract_answer
from aepo_rl.tasks.base import Demonstration, Example
from aepo_rl.tasks.common import ToolOptions, build_tools, chat_messages, check_sandbox, split_examples, system_prompt
from aepo_rl.tools.base import Tool

_TOOLS = ("python",)


class ReasoningGymTask:
    def __init__(self, task_cfg: TaskConfig, generator: str, tool_options: ToolOptions | None = None):
        import reasoning_gym

        self.cfg, self.tool_options = task_cfg, tool_options
        check_sandbox(_TOOLS, tool_options)
        self.name = f"reasoning_gym:{generator}"
        self.system = system_prompt(_TOOLS, tool_options.tool_format if tool_options else "xml")
        sizes = {"train": task_cfg.num_train, "dev": task_cfg.num_dev, "test": task_cfg.num_test}
        self._datasets, self._examples, self._entries = {}, {}, {}
        for offset, (split, size) in enumerate(sizes.items()):
            try:
                dataset = reasoning_gym.create_dataset(generator, seed=task_cfg.seed * 3 + offset, size=size)
            except Exception as err:  # unknown generator names raise various errors inside reasoning-gym
                raise ValueError(f"task '{self.name}': reasoning-gym cannot build "
                                 f"generator '{generator}': {err}") from None
            self._datasets[split] = dataset
            self._examples[split] = []
            for i in range(size):
                entry = dataset[i]
                example = Example(id=f"{generator}-{split}-{i}", question=entry["question"],
                                  answers=[str(entry["answer"])],
                                  data_source=f"reasoning_gym/{generator}", ability="math",
                                  messages=chat_messages(entry["question"], self.system),
                                  extra_info={"split": split})
                self._examples[split].append(example)
                self._entries[example.id] = (dataset, entry)
        self._tools: dict[str, Tool] | None = None

    def examples(self, split: str) -> list[Example]:
        return split_examples(self.name, self._examples, split)

    def tools(self) -> dict[str, Tool]:
        if self._tools is None:
            self._tools = build_tools(self.cfg, allowed=_TOOLS, options=self.tool_options)
        return self._tools

    def _score(self, example: Example, response_text: str) -> float:
        dataset, entry = self._entries[example.id]
        answer = extract_answer(response_text)
        return 0.0 if answer is None else float(dataset.score_answer(answer=answer, entry=entry))

    def reward(self, example: Example, response_text: str) -> float:
        """−1 on a §3 format error, else the generator's checker score of the boxed answer."""
        if format_error(response_text) is not None:
            return FORMAT_PENALTY
        return self._score(example, response_text)

    def correct(self, example: Example, response_text: str) -> bool:
        return self._score(example, response_text) >= 1.0

    def demonstrations(self) -> list[Demonstration]:
        return []

    def texts(self) -> list[str]:
        return [self.system] + [t for e in self._examples["train"] for t in (e.question, e.answers[0])]
