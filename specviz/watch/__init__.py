"""`specviz.watch`: trace any engine built on Hugging Face models (docs/watch.md).

One idea per file: `hooks` captures what each forward call was fed, `steps` turns calls and
declared emissions into the trace's step records, `reference` decodes the oracle on any
transformers 4.45+, `session` is the Watch object, `streamer` adapts HF `generate`.
"""

from specviz.watch.hooks import WatchError
from specviz.watch.session import Watch, watch

__all__ = ["Watch", "WatchError", "watch"]
