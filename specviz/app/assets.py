"""What the page carries besides components: its CSS, the intro, and the scripts Gradio cannot express.

Static strings only; `specviz.views.outputs` owns the output cards' CSS, appended here.
"""

from __future__ import annotations

from specviz.views.outputs import OUTPUTS_CSS

# A plot drawn while its tab is hidden is laid out at the wrong width (plotly measures a hidden
# container); Gradio does not tell plotly when the tab shows, so do it on every tab switch.
RESIZE_PLOTS_JS = """() => {
  const fit = () => document.querySelectorAll('.js-plotly-plot').forEach((gd) => {
    if (gd.offsetParent !== null && window.Plotly) window.Plotly.Plots.resize(gd);
  });
  requestAnimationFrame(fit);
  setTimeout(fit, 200);
}"""
# gr.Plot has no click event: a click on a timeline marker writes the index of its first violation
# (customdata[2], see views.timeline) into the hidden #sv-timeline-pick box, whose input event jumps.
TIMELINE_CLICK_JS = """() => {
  const send = (data) => {
    const point = data && data.points && data.points[0];
    const index = point && point.customdata ? point.customdata[2] : undefined;
    const box = document.querySelector('#sv-timeline-pick textarea, #sv-timeline-pick input');
    if (index === undefined || index === null || !box) return;
    box.value = `${index}:${Date.now()}`;  // a new value on every click: the same marker twice jumps twice
    box.dispatchEvent(new Event('input', { bubbles: true }));
  };
  // Gradio may draw a new plot element on each update: hook every one that appears.
  setInterval(() => {
    const gd = document.querySelector('#sv-timeline .js-plotly-plot');
    if (gd && gd.on && !gd.__svClick) {
      gd.on('plotly_click', send);
      gd.__svClick = true;
    }
  }, 400);
}"""

# The grid is drawn for a wide page; in a narrow container (a phone, below NARROW_PX) this refits
# it: the relayout the figure carries in layout.meta.sv_grid.narrow (short row labels and title,
# a small right margin, pan), and an x range of the last columns that fit at a readable size,
# shifted to keep the first violation in view. Back on a wide container, meta.sv_grid.wide
# restores the figure as drawn. `gd.__svFit` records what was applied, so each figure is fitted once
# per width class (the relayout's own redraw finds nothing to do).
GRID_FIT_JS = """
  const NARROW_PX = 700, COLUMN_PX = 22;
  const fitGrid = () => {
    const gd = document.querySelector('#sv-grid .js-plotly-plot');
    const meta = gd && gd.layout && gd.layout.meta && gd.layout.meta.sv_grid;
    if (!meta || !window.Plotly || gd.offsetParent === null) return;
    const width = gd.getBoundingClientRect().width;
    const narrow = width > 0 && width < NARROW_PX;
    const key = JSON.stringify(meta.wide['title.text']) + meta.columns + (narrow ? ':narrow' : ':wide');
    if (gd.__svFit === key) return;
    gd.__svFit = key;
    const notes = gd.layout.annotations || [];
    if (!narrow) {
      const back = Object.assign({}, meta.wide);
      Object.entries(gd.__svNotes || {}).forEach(([i, a]) => {
        if (notes[i] && notes[i].name === a.name) Object.assign(back, {
          [`annotations[${i}].x`]: a.x, [`annotations[${i}].text`]: a.text, [`annotations[${i}].font.size`]: a.size });
      });
      window.Plotly.relayout(gd, back);
      return;
    }
    gd.__svNotes = {};
    notes.forEach((a, i) => {
      gd.__svNotes[i] = { name: a.name, x: a.x, text: a.text, size: (a.font && a.font.size) || 11 };
    });
    const labels = Math.max(...meta.narrow['yaxis.ticktext'].map((t) => t.replace(/<[^>]*>/g, '').length)) * 7 + 12;
    const room = width - labels - meta.narrow['margin.r'] - 10;
    const count = Math.max(4, Math.min(meta.columns, Math.floor(room / COLUMN_PX)));
    let end = meta.columns - 0.5, start = end - count;
    if (meta.focus_x !== null && meta.focus_x < start + 0.5) { start = meta.focus_x - 1.5; end = start + count; }
    const update = Object.assign({}, meta.narrow, { 'xaxis.range': [start, end] });
    notes.forEach((a, i) => {
      if (a.name === 'region-cache') {
        update[`annotations[${i}].x`] = (Math.max(start, -0.5) + meta.query_x - 0.5) / 2;
        update[`annotations[${i}].text`] = '<b>cache</b>';
      }
      if (a.name === 'region-query') update[`annotations[${i}].text`] = '<b>query</b>';
      if (a.name === 'desync-label') {
        update[`annotations[${i}].text`] = '<b>desync<br>begins<br>here</b>';
        update[`annotations[${i}].font.size`] = 9;
      }
    });
    window.Plotly.relayout(gd, update);
  };
  setInterval(fitGrid, 300);
"""
# Share and move like a trace viewer (see specviz.app.share): the address bar follows what the grid
# shows (slot, trace, step, row, tab: read from the legend's hidden `.sv-where` and the page), keys
# move the grid (written into the hidden #sv-key box; ignored while typing in a field), a click or
# tap on a cell, or Enter, asks for its details (#sv-cell-pick), and an open details panel follows
# the grid to each new step. `window.svLink()` is the link, for the copy button.
SHARE_JS = """
  const TABS = { 'Ragged grid': 'grid', 'Invariants': 'invariants', 'Acceptance': 'acceptance',
                 'KV & positions': 'kv', 'Outputs': 'outputs', 'A vs B': 'compare' };
  const sendBox = (id, value) => {
    const box = document.querySelector(`#${id} textarea, #${id} input`);
    if (!box) return;
    box.value = `${value}:${Date.now()}`;  // a new value each time: the same key twice moves twice
    box.dispatchEvent(new Event('input', { bubbles: true }));
  };
  const where = () => document.querySelector('#sv-grid-legend .sv-where');
  window.svLink = () => {
    const w = where();
    const params = new URLSearchParams();
    const slot = document.querySelector('#sv-inspect input:checked');
    params.set('slot', slot ? slot.value : 'A');
    if (w && w.dataset.trace) params.set('trace', w.dataset.trace);
    if (w && w.dataset.run) params.set('run', w.dataset.run);
    if (w) params.set('step', w.dataset.step);
    if (w && w.dataset.row !== '-1') params.set('row', w.dataset.row);
    const tab = document.querySelector('button[role=tab][aria-selected=true]');
    const id = tab && TABS[tab.textContent.trim()];
    if (id) params.set('tab', id);
    return `${location.origin}${location.pathname}?${params.toString()}`;
  };
  let opened = null;  // the trace and step the details panel was asked for (null: closed)
  // What a key opened is brought into view: the panel once its answer has replaced the old one.
  // An answer equal to the panel shown leaves it in place: after 2 s, that panel is the answer.
  let reveal = null;  // {before: the panel shown when asked, at: when}
  const panelNow = () => document.querySelector('#sv-details .sv-cell');
  const revealPanel = () => { reveal = { before: panelNow(), at: Date.now() }; };
  const showRevealed = () => {
    const panel = panelNow(), waited = reveal ? Date.now() - reveal.at : 0;
    if (!reveal || waited > 15000) { reveal = null; return; }
    if (panel && (panel !== reveal.before || waited > 2000)) {
      panel.scrollIntoView({ block: 'nearest' });
      reveal = null;
    }
  };
  setInterval(showRevealed, 150);
  const askCell = (row, col) => {
    const w = where();
    if (!w) return;
    opened = `${w.dataset.trace}|${w.dataset.step}`;
    showDetails(true);
    sendBox('sv-cell-pick', `cell:${row}:${col}`);
  };
  // h / l: the drawn cell left or right of the panel's, within the row; none past the window's edge.
  const drawnNeighbour = (col, step) => {
    const gd = document.querySelector('#sv-grid .js-plotly-plot');
    const cols = ((gd && gd.layout && gd.layout.meta && gd.layout.meta.sv_grid) || {}).cols || [];
    const i = cols.indexOf(Number(col));
    const next = i < 0 ? (step > 0 ? cols[0] : cols[cols.length - 1]) : cols[i + step];
    return next === undefined ? null : next;
  };
  const syncUrl = () => {
    if (!where()) return;
    const link = window.svLink();
    if (link !== location.href) history.replaceState(null, '', link);
    const w = where(), panel = document.querySelector('#sv-details .sv-cell');
    const now = `${w.dataset.trace}|${w.dataset.step}`;
    if (opened && panel && now !== opened) askCell(panel.dataset.row, panel.dataset.col);
  };
  setInterval(syncUrl, 300);
  const hookCells = () => {
    const gd = document.querySelector('#sv-grid .js-plotly-plot');
    if (!gd || !gd.on || gd.__svCells) return;
    gd.__svCells = true;
    gd.on('plotly_click', (data) => {
      const meta = gd.layout && gd.layout.meta && gd.layout.meta.sv_grid;
      const point = data && data.points && data.points[0];
      if (!meta || !point || point.curveNumber !== 0) return;
      const col = meta.cols[Math.round(point.x)], row = meta.rows[Math.round(point.y)];
      if (col !== undefined && row !== undefined) { revealPanel(); askCell(row, col); }
    });
  };
  setInterval(hookCells, 400);
  // Open or closed is a class of <body>: Gradio redraws its own elements' classes, never the body's.
  const toggleKeys = (show) => {
    document.body.classList.toggle('sv-keys-open', show);
    // The list sits under the grid: from another tab, `?` opens the grid's tab to show it.
    const gridTab = [...document.querySelectorAll('button[role=tab]')]
      .find((b) => b.textContent.trim() === 'Ragged grid');
    if (show && gridTab && gridTab.getAttribute('aria-selected') !== 'true') gridTab.click();
    // The list sits under the grid, often below the window: bring it into view once it is laid out.
    const list = document.querySelector('#sv-keys-help');
    if (show && list) requestAnimationFrame(() => setTimeout(() => list.scrollIntoView({ block: 'nearest' }), 50));
  };
  window.svToggleKeys = () => toggleKeys(!document.body.classList.contains('sv-keys-open'));
  const showDetails = (show) => document.body.classList.toggle('sv-details-closed', !show);
  document.addEventListener('keydown', (e) => {
    if (e.ctrlKey || e.metaKey || e.altKey || e.defaultPrevented) return;
    const t = e.target;
    if (t && t.closest && t.closest('input, textarea, select, [contenteditable=""], [contenteditable=true]')) return;
    const key = e.key;
    if (key === '?') { window.svToggleKeys(); e.preventDefault(); return; }
    if (key === 'Escape') {
      toggleKeys(false);
      opened = null;
      showDetails(false);
      return;
    }
    if (['.', ',', 'n', 'N', 'j', 'k'].includes(key)) { sendBox('sv-key', key); e.preventDefault(); return; }
    const panel = document.querySelector('#sv-details .sv-cell');
    if ((key === 'h' || key === 'l') && panel && opened) {
      const col = drawnNeighbour(panel.dataset.col, key === 'l' ? 1 : -1);
      if (col !== null) askCell(panel.dataset.row, col);
      e.preventDefault();
      return;
    }
    // Enter opens a cell's details only from the page or the grid: on a button or a tab it is theirs.
    const free = !t || t === document.body || (t.closest && t.closest('#sv-grid'));
    if (key === 'Enter' && free) {
      const w = where();
      if (!w) return;
      opened = `${w.dataset.trace}|${w.dataset.step}`;
      showDetails(true);
      revealPanel();
      sendBox('sv-key', 'enter');
      e.preventDefault();
    }
  });
"""
# The copy button: the link in its box (shown), and on the clipboard where the page may write it.
COPY_LINK_JS = """() => {
  const link = window.svLink ? window.svLink() : location.href;
  if (navigator.clipboard && window.isSecureContext) navigator.clipboard.writeText(link).catch(() => {});
  return link;
}"""
TOGGLE_KEYS_JS = "() => { if (window.svToggleKeys) window.svToggleKeys(); }"
PAGE_JS = TIMELINE_CLICK_JS.rstrip()[:-1] + GRID_FIT_JS + SHARE_JS + "}"  # what the page runs once, on load

CSS = (
    OUTPUTS_CSS
    + """
.sv-summary { min-height: 80px; }
.sv-summary h3 { margin: 0 0 4px 0; }
.sv-summary p { margin: 4px 0; }
/* the checks not run, folded to one small line: the grid's first rows stay on the first screen */
.sv-summary details { margin: -4px 0 -4px 0; font-size: 0.8em; line-height: 1.1; }
.sv-summary details summary { padding: 0; }
#sv-intro p { margin: 2px 0; }
#sv-intro h1 { margin: 0 0 2px 0; font-size: 1.5em; }
/* Words never break inside: "violations", not "violatio ns"; "expected", not "expect ed";
   "position_ids", not "position_ ids". Table headers stay on one line; a table wider than its
   panel scrolls inside it instead of squeezing its words into letters. */
.table-wrap th, th .cell-wrap, th span { word-break: normal !important;
  overflow-wrap: normal !important; white-space: nowrap !important; hyphens: none; }
td, td span, .prose { word-break: normal !important; overflow-wrap: normal !important; hyphens: none; }
.prose th { white-space: nowrap; }
#sv-row-text table, #sv-step-text table, .sv-summary table { display: block; max-width: 100%; overflow-x: auto; }
#sv-violations td .cell-wrap, #sv-violations td span { overflow-wrap: normal !important; }
.sv-status { color: #991b1b; background: #fef2f2; border-radius: 6px; padding: 2px 8px; }
.sv-status p { margin: 0; }
.sv-nowrap, .sv-summary code { white-space: nowrap; }
/* The grid's legend: every kind and mark the step shows; entries wrap between, never inside. */
.sv-legend { display: flex; flex-wrap: wrap; gap: 4px 16px; font-size: 12px; padding: 4px 8px; }
.sv-legend-item { display: inline-flex; align-items: center; gap: 6px; max-width: 100%; }
.sv-swatch { display: inline-block; width: 12px; height: 12px; box-sizing: border-box; flex: none; }
/* Messages appear at the bottom: at the top they cover slot B's upload button. */
.toast-wrap { top: auto !important; bottom: var(--size-4) !important; }
/* A live run's progress covers the slot's summary with an opaque panel, not over its faded title. */
.sv-summary > .wrap:not(.hide) { background: var(--block-background-fill) !important; opacity: 1 !important; }
/* A phone: the page uses its width. */
@media (max-width: 640px) {
  .gradio-container { padding-left: 4px !important; padding-right: 4px !important; }
  .sv-legend { font-size: 11px; }
}
/* A plotly click on the timeline is sent through this box; nobody types in it. */
#sv-timeline-pick { display: none !important; }
/* The page's script writes keys and cell clicks into these boxes; shown only when asked for. */
.sv-hidden-box { display: none !important; }
body:not(.sv-keys-open) #sv-keys-help, body.sv-details-closed #sv-details { display: none !important; }
#sv-grid { outline-offset: 2px; }
.sv-cell { border: 1px solid #cbd5e1; border-radius: 8px; padding: 6px 10px; margin: 4px 0; font-size: 13px; }
.sv-cell table { border-collapse: collapse; margin: 4px 0; }
.sv-cell th, .sv-cell td { border: 1px solid #e2e8f0; padding: 2px 8px; text-align: left; vertical-align: top; }
.sv-cell th { white-space: nowrap; }
.sv-keys-help { border: 1px solid #cbd5e1; border-radius: 8px; padding: 6px 10px; font-size: 13px; }
.sv-keys-help td { padding: 1px 10px 1px 0; }
.sv-keys-help kbd { border: 1px solid #94a3b8; border-radius: 3px; padding: 0 4px;
  font-family: ui-monospace, monospace; }
"""
)

INTRO = """
# specviz: where does batch speculative decoding go wrong?
Load runs into slots **A** and **B**; the **ragged grid** shows what the engine fed and where it first went wrong
(the **dark red cell**). Click a cell for its details; press **?** for the keys.
"""
