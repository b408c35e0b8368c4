r"""A task in one file: "How many words does this sentence have?", answered with the wordcount tool.

A task hands the trainer chat prompts (``examples``), the tools its agent may call (``tools``),
a reward, a pass/fail verdict for evaluation (``correct``), teacher demonstrations for cold-start
SFT (may be empty) and text to train the tiny model's tokenizer on (``texts``). It is registered
with a factory ``(cfg) -> Task`` and picked by ``task.name``. It uses the tool of my_tool.py
and scores with ``task.reward`` (e.g. the numeric_match reward of my_reward.py):

    aepo --plugin examples/plugins/my_tool.py --plugin examples/plugins/my_reward.py \
         --plugin examples/plugins/my_task.py train task.name=wordcount task.reward=numeric_match
"""

import random

from aepo_rl.protocol import Protocol
from aepo_rl.registry import register_task
from aepo_rl.rewards import get_reward
from aepo_rl.tasks import Demonstration, Example
from aepo_rl.tasks.common import chat_messages
from aepo_rl.tools import get_tool

WORDS = "the a quick brown fox jumps over lazy dog river stone light small old green house".split()


@register_task("wordcount")
class WordCountTask:
    """``task.num_train`` / ``num_dev`` / ``num_test`` questions drawn with ``task.seed``."""

    name = "wordcount"

    def __init__(self, cfg):
        rng = random.Random(cfg.task.seed)
        sizes = {"train": cfg.task.num_train, "dev": cfg.task.num_dev, "test": cfg.task.num_test}
        self.tool = get_tool("wordcount")
        self._reward = get_reward(cfg.task.reward)
        self.protocol = Protocol(self.tools())  # the system prompt, call and result text of the XML protocol
        self.system = self.protocol.system_prompt()
        self.splits = {split: [self._example(f"{split}-{i}", rng) for i in range(size)]
                       for split, size in sizes.items()}

    def _example(self, id: str, rng: random.Random) -> Example:
        sentence = " ".join(rng.choices(WORDS, k=rng.randint(3, 12)))
        question = f"How many words are in: {sentence}"
        return Example(id=id, question=question, answers=[str(len(sentence.split()))], data_source="wordcount",
                       messages=chat_messages(question, self.system),
                       extra_info={"sentence": sentence})

    def examples(self, split):
        return self.splits[split]

    def tools(self):
        return {self.tool.tag: self.tool}

    def reward(self, example, response_text):
        return self._reward(response_text, example.answers, example.question)

    def correct(self, example, response_text):
        return self.reward(example, response_text) >= 1.0

    def demonstrations(self):
        """The teacher: call the tool on the sentence, then answer with its result."""
        demos = []
        for example in self.splits["train"]:
            sentence = example.extra_info["sentence"]
            count = self.tool.run(sentence)
            demos.append(Demonstration(example, [(self.protocol.format_call("wordcount", sentence), True),
                                                 (self.protocol.format_result(count), False),
                                                 (" " + self.protocol.format_answer(count), True)]))
        return demos

    def texts(self):
        return [self.system] + [e.question for e in self.splits["train"]] + \
               ["".join(text for text, _ in d.pieces) for d in self.demonstrations()]
