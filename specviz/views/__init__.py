"""Views: pure functions from a trace (and its forensics report) to plotly figures, pandas tables,
HTML and markdown. No UI framework here; `app.py` wires these into Gradio.
"""

from specviz.views.grid import StepGrid, grid_figure, step_grid
from specviz.views.heatmaps import acceptance_heatmap, drift_heatmap, kv_heatmap
from specviz.views.metrics import acceptance_figure, acceptance_markdown, sequence_table
from specviz.views.outputs import RunOutputs, outputs_html
from specviz.views.run import LoadedRun, analyse
from specviz.views.summary import compare_table, summary_markdown
from specviz.views.timeline import timeline_figure, violations_table

__all__ = [
    "LoadedRun",
    "RunOutputs",
    "StepGrid",
    "acceptance_figure",
    "acceptance_heatmap",
    "acceptance_markdown",
    "analyse",
    "compare_table",
    "drift_heatmap",
    "grid_figure",
    "kv_heatmap",
    "outputs_html",
    "sequence_table",
    "step_grid",
    "summary_markdown",
    "timeline_figure",
    "violations_table",
]
