"""Views: pure functions from a trace (and its forensics report) to plotly figures, pandas tables,
HTML and markdown. No UI framework here; `app.py` wires these into Gradio.
"""

from specviz.views.grid import grid_figure
from specviz.views.heatmaps import acceptance_heatmap, drift_heatmap, kv_heatmap
from specviz.views.metrics import acceptance_figure, acceptance_markdown, sequence_table
from specviz.views.outputs import RunOutputs, outputs_html
from specviz.views.run import (
    GridView,
    LoadedRun,
    analyse,
    empty_figure,
    grid_view,
    slot_outputs_html,
    slot_summary_markdown,
    slots_compare_table,
)
from specviz.views.summary import compare_table, summary_markdown
from specviz.views.timeline import timeline_figure, violations_table

__all__ = [
    "GridView",
    "LoadedRun",
    "RunOutputs",
    "acceptance_figure",
    "acceptance_heatmap",
    "acceptance_markdown",
    "analyse",
    "compare_table",
    "drift_heatmap",
    "empty_figure",
    "grid_figure",
    "grid_view",
    "kv_heatmap",
    "outputs_html",
    "sequence_table",
    "slot_outputs_html",
    "slot_summary_markdown",
    "slots_compare_table",
    "summary_markdown",
    "timeline_figure",
    "violations_table",
]
