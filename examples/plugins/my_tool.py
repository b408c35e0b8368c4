"""A tool in one file: ``<wordcount>some text</wordcount>`` answers with the number of words.

A tool has a ``name``, the ``tag`` the model writes the call in, a one-line ``description`` and
``run(arg) -> str``, which never raises: a bad argument comes back as error text (§1.1). A task
hands it to the agent from its ``tools()`` (see my_task.py). Load it with

    aepo --plugin examples/plugins/my_tool.py --plugin examples/plugins/my_task.py train task.name=wordcount
"""

from aepo_rl.tools import argument_error, register_tool


@register_tool("wordcount")
class WordCount:
    name = tag = "wordcount"
    description = "<wordcount>text</wordcount> counts the words of the text"

    def __init__(self, max_chars: int = 10_000):
        self.max_chars = max_chars

    def run(self, arg: str) -> str:
        return argument_error(arg, self.max_chars) or str(len(arg.split()))
