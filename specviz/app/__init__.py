"""The Gradio app's parts; the root `app.py` (the Space's entry) assembles them into one page.

Thin wiring only: every figure, table and text comes from `specviz.views`, every run from
`specviz.engine`, every check from `specviz.analysis`. Nothing else in specviz imports this package.

- `assets`: CSS, the intro, the page's scripts.
- `loading`: bundled traces and uploads. `live`: live runs. `serve`: public mode, the live-run
  gate, file cleanup, memory (what makes the app safe as a public Space).
- `run_slots`: run slots A and B, the inspect switch, the comparison. `detail`: the detail tabs,
  each a dataclass of its components that builds itself and says what it shows.
- `events`: the handlers, each returning `{component: value}`, and their bindings (`handlers`: the
  one-line failure every handler shares; `page_open`: the page opening on its defaults or its link).
"""
