import os
import shutil
import tempfile

import torch

torch.set_num_threads(1)  # tiny models: threads only add contention

# Gradio's uploads and downloads of this test session go to a folder of its own, removed at the
# end (set before any test module imports gradio, which reads it then; servers the tests start
# inherit it): a test run leaves nothing in /tmp/gradio.
if "GRADIO_TEMP_DIR" not in os.environ:
    _GRADIO_TEMP = tempfile.mkdtemp(prefix="specviz-tests-gradio-")
    os.environ["GRADIO_TEMP_DIR"] = _GRADIO_TEMP
else:
    _GRADIO_TEMP = None


def pytest_sessionfinish(session, exitstatus) -> None:
    if _GRADIO_TEMP is not None:
        shutil.rmtree(_GRADIO_TEMP, ignore_errors=True)
