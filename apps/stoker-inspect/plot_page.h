// SPDX-License-Identifier: Apache-2.0
// The HTML page around the plot (plot.cpp, plot_html): a style sheet, the picture's SVG,
// its data, and a plain script that redraws the lanes for a zoomed time range and shows each
// queue's fill under the pointer. Nothing is loaded from elsewhere. The page is also
// well-formed XML: the scripts sit in CDATA sections, and the data's '<', '>' and '&' are
// escaped, so that they can end neither.
#pragma once

namespace stoker::inspect {

// Then the page's title, escaped.
inline constexpr const char* kPageHead = "<!DOCTYPE html>\n<html lang=\"en\">\n<head><meta charset=\"utf-8\"/><title>";

// Then the picture's SVG.
inline constexpr const char* kPageStyle = R"html(</title>
<style>
body { font-family: sans-serif; margin: 12px; color: #222222; }
svg.occupancy { display: block; max-width: 100%; height: auto; user-select: none; }
.hint { color: #555555; font-size: 13px; margin: 0 0 6px 8px; }
#errors { color: #b00020; font-size: 13px; white-space: pre-wrap; }
</style>
</head>
<body data-plot="loading">
<p class="hint">Hover over the lanes to read each queue's fill at that time; drag across them to zoom into a
time range; double-click, or <button id="reset" type="button">show the whole run</button>, to zoom out.
<span id="view"></span></p>
)html";

// Errors from the script below end up in the page, where a reader (and the browser test)
// sees them; body's data-plot says "ready" once the plot is drawn, "error" after any error.
// Then "const data = {...};", the plot's data.
inline constexpr const char* kPageErrors = R"html(<pre id="errors" hidden="hidden"></pre>
<script>//<![CDATA[
window.onerror = function (message, source, line, column) {
  document.body.setAttribute("data-plot", "error");
  const out = document.getElementById("errors");
  out.hidden = false;
  out.textContent += "script error: " + message + " (line " + line + ", column " + column + ")\n";
  return false;
};
//]]></script>
<script>//<![CDATA[
"use strict";
)html";

// `data` holds the geometry of the SVG (lanes' tops, the time axis's pixels), the time range
// [t0, t1] cut into `bins` equal bins, and per lane each bin's lowest, mean and highest fill
// in thousandths, the share of its samples that found the producer waiting for room, in
// thousandths, and its number of samples; `marks` are the groups of vertical marks (epochs,
// autotune moves): each with its class, colour, dash, label row and [[t, label, title], ...].
inline constexpr const char* kPageScript = R"js(
(function () {
  const NS = "http://www.w3.org/2000/svg";
  const svg = document.querySelector("svg.occupancy");
  // The page has a title of its own; the picture's would cover the readouts as a tooltip.
  const title = svg.querySelector("title");
  if (title) title.remove();
  const plots = Array.from(svg.querySelectorAll("g.lane-plot"));
  const readouts = Array.from(svg.querySelectorAll("g.lane")).map(function (g) {
    return Array.from(g.querySelectorAll("text.readout"));
  });
  const summaries = readouts.map(function (texts) { return texts.map(function (t) { return t.textContent; }); });
  const columns = data.columns;
  const binLength = (data.t1 - data.t0) / data.bins;
  const whole = [data.t0, data.t1];
  let view = whole.slice();
  let points = [];  // per lane, left to right: {x, lo, mean, hi, wait}, fills and shares from 0 to 1

  function add(name, attributes, parent, text) {
    const e = document.createElementNS(NS, name);
    for (const key in attributes) e.setAttribute(key, attributes[key]);
    if (text !== undefined) e.textContent = text;
    parent.appendChild(e);
    return e;
  }
  function num(v) { return String(Math.round(v * 10) / 10); }
  function x(t) { return data.left + (t - view[0]) * columns / (view[1] - view[0]); }
  function time(px) { return view[0] + (px - data.left) * (view[1] - view[0]) / columns; }
  function y(lane, fill) { return data.lanes[lane].top + data.laneHeight * (1 - fill); }
  function centre(i) { return data.t0 + (i + 0.5) * binLength; }

  // The bins whose centres fall in each column of the view, merged, as the picture merges the
  // samples of a column; and the nearest bin on either side of the view, so that the lines run
  // on to its edges. Columns are 1 to 4 pixels wide, by the picture's rule: about 4 samples
  // wide where the samples are dense.
  function rebin() {
    const first = Math.max(0, Math.floor((view[0] - data.t0) / binLength - 0.5));
    const last = Math.min(data.bins - 1, Math.ceil((view[1] - data.t0) / binLength - 0.5));
    let samples = 0;
    for (const lane of data.lanes) {
      let n = 0;
      for (let i = first; i <= last; i++) n += lane.n[i];
      samples = Math.max(samples, n);
    }
    const width = Math.min(4, Math.max(1, Math.ceil(4 * columns / Math.max(samples, 1))));
    const count = columns / width;
    const perSecond = count / (view[1] - view[0]);
    points = data.lanes.map(function (lane) {
      const merged = new Array(count).fill(null);
      let before = -1, after = -1;
      for (let i = first; i <= last; i++) {
        if (lane.n[i] === 0) continue;
        const c = Math.floor((centre(i) - view[0]) * perSecond);
        if (c < 0) before = i;
        if (c >= count && after < 0) after = i;
        if (c < 0 || c >= count) continue;
        const m = merged[c];
        if (m === null) {
          merged[c] = { lo: lane.lo[i], hi: lane.hi[i], sum: lane.mean[i] * lane.n[i], wait: lane.wait[i] * lane.n[i],
                        n: lane.n[i] };
        } else {
          m.lo = Math.min(m.lo, lane.lo[i]);
          m.hi = Math.max(m.hi, lane.hi[i]);
          m.sum += lane.mean[i] * lane.n[i];
          m.wait += lane.wait[i] * lane.n[i];
          m.n += lane.n[i];
        }
      }
      for (let i = first - 1; before < 0 && i >= 0; i--) if (lane.n[i] > 0) before = i;
      for (let i = last + 1; after < 0 && i < data.bins; i++) if (lane.n[i] > 0) after = i;
      function bin(i) {
        return { x: x(centre(i)), lo: lane.lo[i] / 1000, mean: lane.mean[i] / 1000, hi: lane.hi[i] / 1000,
                 wait: lane.wait[i] / 1000 };
      }
      const out = before >= 0 ? [bin(before)] : [];
      merged.forEach(function (m, c) {
        if (m === null) return;
        out.push({ x: data.left + (c + 0.5) * width, lo: m.lo / 1000, mean: m.sum / m.n / 1000, hi: m.hi / 1000,
                   wait: m.wait / m.n / 1000 });
      });
      if (after >= 0) out.push(bin(after));
      return out;
    });
  }

  function drawLanes() {
    plots.forEach(function (g, lane) {
      const p = points[lane];
      function at(fill) { return function (q) { return num(q.x) + "," + num(y(lane, q[fill])); }; }
      const mean = p.map(at("mean"));
      let area = "", band = "";
      if (p.length) {
        const bottom = num(y(lane, 0));
        area = "M" + num(p[0].x) + "," + bottom + " " + mean.join(" ") + " " + num(p[p.length - 1].x) + "," + bottom +
            "Z";
        band = "M" + p.map(at("hi")).join(" ") + " " + p.map(at("lo")).reverse().join(" ") + "Z";
      }
      g.querySelector("path.area").setAttribute("d", area);
      g.querySelector("path.band").setAttribute("d", band);
      g.querySelector("path.mean").setAttribute("d", p.length ? "M" + mean.join(" ") : "");
      // The strip under the lane: the share of samples that found the producer waiting for room.
      const strip = data.lanes[lane].top + data.laneHeight + data.waitStrip - 1;
      const waiting = p.map(function (q) { return num(q.x) + "," + num(strip - (data.waitStrip - 2) * q.wait); });
      g.querySelector("path.waiting").setAttribute("d", p.length ? "M" + num(p[0].x) + "," + num(strip) + " " +
          waiting.join(" ") + " " + num(p[p.length - 1].x) + "," + num(strip) + "Z" : "");
    });
  }

  // 1, 2 or 5 times a power of ten, about `ticks` of them over `range`: the picture's rule.
  function niceStep(range, ticks) {
    const raw = range / ticks;
    const power = Math.pow(10, Math.floor(Math.log10(raw)));
    for (const m of [1, 2, 5]) if (raw <= m * power) return m * power;
    return 10 * power;
  }

  function drawAxis() {
    const grid = svg.querySelector("g.time-grid"), ticks = svg.querySelector("g.time-axis");
    grid.replaceChildren();
    ticks.replaceChildren();
    const step = niceStep(view[1] - view[0], 6);
    const decimals = step >= 1 ? 0 : Math.ceil(-Math.log10(step) - 1e-9);
    for (let k = Math.ceil(view[0] / step - 1e-9); k * step <= view[1] + step * 1e-9; k++) {
      const at = num(x(k * step));
      add("line", { x1: at, y1: num(data.top), x2: at, y2: num(data.bottom) }, grid);
      add("line", { x1: at, y1: num(data.bottom), x2: at, y2: num(data.bottom + 5) }, ticks);
      add("text", { x: at, y: num(data.bottom + 18), stroke: "none" }, ticks, (k * step).toFixed(decimals));
    }
  }

  // The epochs' starts and the autotuner's moves: a line across the lanes each, labelled where
  // the labels do not crowd, with the whole text as the line's tooltip.
  function drawMarks() {
    for (const group of data.marks) {
      const g = svg.querySelector("g." + group.cls);
      g.replaceChildren();
      const labels = [];  // drawn after the lines, so that none crosses a label
      let lastLabel = -Infinity;
      for (const [t, label, title] of group.marks) {
        if (t < view[0] || t > view[1]) continue;
        const px = x(t);
        const line = add("line", { x1: num(px), y1: num(data.top - 14), x2: num(px), y2: num(data.bottom),
                                   stroke: group.stroke, "stroke-dasharray": group.dash }, g);
        if (title) add("title", {}, line, title);
        if (px - lastLabel < data.markLabelGap) continue;
        lastLabel = px;
        labels.push([px, label]);
      }
      for (const [px, label] of labels) {
        add("text", { x: num(px + 3), y: num(group.labelY), "font-size": "11", fill: group.stroke, stroke: "#ffffff",
                      "stroke-width": "3", "stroke-linejoin": "round", "paint-order": "stroke" }, g, label);
      }
    }
  }

  // Digits enough to tell one pixel column of the view from the next.
  function seconds(t) {
    const decimals = Math.min(6, Math.max(0, Math.ceil(-Math.log10((view[1] - view[0]) / columns))));
    return t.toFixed(decimals) + " s";
  }

  const viewText = document.getElementById("view");
  function draw() {
    rebin();
    drawLanes();
    drawAxis();
    drawMarks();
    viewText.textContent = view[0] === whole[0] && view[1] === whole[1]
        ? "Showing the whole run, " + seconds(whole[1]) + "."
        : "Showing " + seconds(view[0]) + " to " + seconds(view[1]) + " of " + seconds(whole[1]) + ".";
  }

  // A range within the run, and no shorter than two bins: there is nothing finer to show.
  function zoom(range) {
    const shortest = Math.min(2 * binLength, whole[1] - whole[0]);
    let from = Math.max(whole[0], range[0]), to = Math.min(whole[1], range[1]);
    if (!(to - from >= shortest)) {
      const middle = Math.min(Math.max((from + to) / 2, whole[0] + shortest / 2), whole[1] - shortest / 2);
      from = middle - shortest / 2;
      to = middle + shortest / 2;
    }
    view = [from, to];
    draw();
    // The address keeps the range (#t=from,to), so that a reload or a link shows it again.
    const wholeRun = from === whole[0] && to === whole[1];
    try {
      history.replaceState(null, "", wholeRun ? location.pathname + location.search : "#t=" + from + "," + to);
    } catch (e) {
      // Some browsers refuse it for local files; the zoom works all the same.
    }
  }

  const height = data.bottom - data.top;
  const selection = add("rect", { y: num(data.top), height: num(height), width: 0, fill: "#c0392b",
                                  "fill-opacity": "0.12", visibility: "hidden", "pointer-events": "none" }, svg);
  const cursor = add("line", { y1: num(data.top - 14), y2: num(data.bottom), stroke: "#c0392b", visibility: "hidden",
                               "pointer-events": "none" }, svg);
  const cursorText = add("text", { y: num(data.top - 19), "font-size": "11", fill: "#c0392b", "text-anchor": "middle",
                                   visibility: "hidden", "pointer-events": "none" }, svg);
  const hit = add("rect", { x: num(data.left), y: num(data.top), width: columns, height: num(height),
                            fill: "transparent", cursor: "crosshair" }, svg);

  function pointerX(event) {
    const p = svg.createSVGPoint();
    p.x = event.clientX;
    p.y = event.clientY;
    const px = p.matrixTransform(svg.getScreenCTM().inverse()).x;
    return Math.min(data.left + columns, Math.max(data.left, px));
  }

  function showReadouts(px) {
    for (const e of [cursor, cursorText]) e.setAttribute("visibility", "visible");
    cursor.setAttribute("x1", num(px));
    cursor.setAttribute("x2", num(px));
    cursorText.setAttribute("x", num(px));
    cursorText.textContent = seconds(time(px));
    points.forEach(function (p, lane) {
      let best = null;
      for (const q of p) if (best === null || Math.abs(q.x - px) < Math.abs(best.x - px)) best = q;
      if (best === null) {
        readouts[lane][0].textContent = "no samples";
        readouts[lane][1].textContent = "";
        return;
      }
      readouts[lane][0].textContent = "at " + seconds(time(best.x)) + ": fill " + best.mean.toFixed(2);
      readouts[lane][1].textContent = "lowest " + best.lo.toFixed(2) + ", highest " + best.hi.toFixed(2) +
          ", producer waiting in " + Math.round(100 * best.wait) + "% of its samples";
    });
  }

  function hideReadouts() {
    for (const e of [cursor, cursorText]) e.setAttribute("visibility", "hidden");
    readouts.forEach(function (texts, lane) {
      texts.forEach(function (t, i) { t.textContent = summaries[lane][i]; });
    });
  }

  let dragFrom = null;
  hit.addEventListener("mousedown", function (event) {
    if (event.button !== 0) return;
    dragFrom = pointerX(event);
    event.preventDefault();
  });
  window.addEventListener("mousemove", function (event) {
    if (dragFrom === null) return;
    const to = pointerX(event);
    selection.setAttribute("x", num(Math.min(dragFrom, to)));
    selection.setAttribute("width", num(Math.abs(to - dragFrom)));
    selection.setAttribute("visibility", "visible");
  });
  window.addEventListener("mouseup", function (event) {
    if (dragFrom === null) return;
    const from = dragFrom, to = pointerX(event);
    dragFrom = null;
    selection.setAttribute("visibility", "hidden");
    if (Math.abs(to - from) >= 3) zoom([time(Math.min(from, to)), time(Math.max(from, to))]);
  });
  hit.addEventListener("mousemove", function (event) { showReadouts(pointerX(event)); });
  hit.addEventListener("mouseleave", hideReadouts);
  hit.addEventListener("dblclick", function () { zoom(whole); });
  document.getElementById("reset").addEventListener("click", function () { zoom(whole); });

  const asked = /^#t=([-+0-9.eE]+),([-+0-9.eE]+)$/.exec(location.hash);
  if (asked && Number(asked[1]) < Number(asked[2])) zoom([Number(asked[1]), Number(asked[2])]);
  else draw();
  document.body.setAttribute("data-plot", "ready");
})();
//]]></script>
</body>
</html>
)js";

}  // namespace stoker::inspect
