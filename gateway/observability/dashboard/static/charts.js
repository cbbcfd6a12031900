// Hand-written SVG charts for the dashboard: no library, nothing loaded from anywhere but the gateway.
// Every chart is an <svg data-chart="..."> that scales to its container; numbers go in <title> tooltips.

const SVG_NS = "http://www.w3.org/2000/svg";
export const PALETTE = ["#2a9d8f", "#e76f51", "#457b9d", "#e9c46a", "#8d5fd3", "#f4a261", "#6a994e", "#d62828"];
const WIDTH = 640;
const LABEL_W = 150;
const VALUE_W = 90;

export function svg(tag, attrs = {}, text = null) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  if (text !== null) el.textContent = text;
  return el;
}

function titled(el, text) {
  el.appendChild(svg("title", {}, text));
  return el;
}

function root(name, height) {
  return svg("svg", {
    viewBox: `0 0 ${WIDTH} ${height}`, class: "chart", "data-chart": name, role: "img",
    preserveAspectRatio: "xMinYMin meet",
  });
}

/** A round step for about `count` ticks up to `max`. */
function niceStep(max, count) {
  const raw = max / count;
  const magnitude = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * magnitude).find((s) => s >= raw);
  return step || raw;
}

/** `whole`: counts, so ticks are whole numbers. */
function yAxis(chart, max, top, bottom, left, right, format, whole = false) {
  const step = whole ? Math.ceil(niceStep(max, 4)) : niceStep(max, 4);
  const top_value = Math.max(step, Math.ceil(max / step - 1e-9) * step);
  for (let v = 0; v <= top_value + step / 2; v += step) {
    const y = bottom - (v / top_value) * (bottom - top);
    chart.appendChild(svg("line", { x1: left, x2: right, y1: y, y2: y, class: "grid" }));
    chart.appendChild(svg("text", { x: left - 6, y: y + 4, class: "tick", "text-anchor": "end" }, format(v)));
  }
  return top_value;
}

/** Horizontal stacked bars: rows [{label, values: {key: number}}], series [{key, name, color}]; the figure at
 * the end of a bar is the row's sum, or `total(row, sum)` in `totalFormat`. */
export function hbars(name, rows, series, { format, max = null, total = null, totalFormat = null } = {}) {
  const rowH = 26;
  const chart = root(name, Math.max(1, rows.length) * rowH + 8);
  const sums = rows.map((r) => series.reduce((s, k) => s + (r.values[k.key] || 0), 0));
  const scale = max ?? Math.max(...sums, 0);
  const barW = WIDTH - LABEL_W - VALUE_W;
  rows.forEach((row, i) => {
    const y = 4 + i * rowH;
    chart.appendChild(svg("text", { x: LABEL_W - 8, y: y + 16, class: "label", "text-anchor": "end" }, row.label));
    chart.appendChild(svg("rect", { x: LABEL_W, y: y + 3, width: barW, height: rowH - 8, class: "track" }));
    let x = LABEL_W;
    for (const s of series) {
      const v = row.values[s.key] || 0;
      if (v <= 0 || scale <= 0) continue;
      const w = (v / scale) * barW;
      const bar = svg("rect", { x, y: y + 3, width: Math.max(w, 1), height: rowH - 8, fill: s.color, class: "bar" });
      chart.appendChild(titled(bar, `${row.label} ${s.name}: ${format(v)}`));
      x += w;
    }
    const shown = total ? total(row, sums[i]) : sums[i];
    const text = shown === null || shown === undefined ? "-" : (totalFormat || format)(shown);
    chart.appendChild(svg("text", { x: WIDTH - VALUE_W + 6, y: y + 16, class: "value" }, text));
  });
  return chart;
}

/** Vertical grouped bars: groups [{label, values: {key: number|null}}], series [{key, name, color}]. */
export function columns(name, groups, series, { format }) {
  const height = 220;
  const [top, bottom, left, right] = [12, height - 34, 64, WIDTH - 8];
  const chart = root(name, height);
  const values = groups.flatMap((g) => series.map((s) => g.values[s.key] ?? 0));
  const max = yAxis(chart, Math.max(...values, 0) || 1, top, bottom, left, right, format);
  const slot = (right - left) / Math.max(1, groups.length);
  const barW = Math.min(28, (slot - 12) / series.length);
  groups.forEach((g, gi) => {
    const x0 = left + gi * slot + (slot - barW * series.length) / 2;
    series.forEach((s, si) => {
      const v = g.values[s.key];
      if (v === null || v === undefined) return;
      const h = (v / max) * (bottom - top);
      const bar = svg("rect", { x: x0 + si * barW, y: bottom - h, width: barW - 2, height: Math.max(h, 0.5), fill: s.color });
      chart.appendChild(titled(bar, `${g.label} ${s.name}: ${format(v)}`));
    });
    chart.appendChild(svg("text", { x: left + gi * slot + slot / 2, y: bottom + 16, class: "label", "text-anchor": "middle" }, g.label));
  });
  return chart;
}

function timeLabel(t) {
  const d = new Date(t * 1000);
  return `${String(d.getHours()).padStart(2, "0")}:${String(d.getMinutes()).padStart(2, "0")}`;
}

function timeAxis(chart, start, end, left, right, bottom) {
  const ticks = 6;
  for (let i = 0; i <= ticks; i++) {
    const t = start + ((end - start) * i) / ticks;
    const x = left + ((right - left) * i) / ticks;
    chart.appendChild(svg("text", { x, y: bottom + 16, class: "tick", "text-anchor": "middle" }, timeLabel(t)));
  }
}

/** Stacked columns over time: buckets [{t, values: {key: number}}] evenly spaced by `step` seconds; `whole`
 * for counts. */
export function timeColumns(name, buckets, series, { format, start, end, step, whole = false }) {
  const height = 220;
  const [top, bottom, left, right] = [12, height - 30, 64, WIDTH - 20];
  const chart = root(name, height);
  const sums = buckets.map((b) => series.reduce((s, k) => s + (b.values[k.key] || 0), 0));
  const max = yAxis(chart, Math.max(...sums, 0) || 1e-9, top, bottom, left, right, format, whole);
  const slots = Math.max(1, Math.ceil((end - start) / step));
  const w = (right - left) / slots;
  for (const b of buckets) {
    const x = left + ((b.t - start) / step) * w;
    let y = bottom;
    for (const s of series) {
      const v = b.values[s.key] || 0;
      if (v <= 0) continue;
      const h = (v / max) * (bottom - top);
      y -= h;
      const bar = svg("rect", { x: x + 0.5, y, width: Math.max(w - 1, 1), height: h, fill: s.color });
      chart.appendChild(titled(bar, `${timeLabel(b.t)} ${s.name}: ${format(v)}`));
    }
  }
  timeAxis(chart, start, start + slots * step, left, right, bottom);
  return chart;
}

/** Lines over time: lines [{name, color, points: [[t, v], ...]}]. */
export function timeLines(name, lines, { format, start, end }) {
  const height = 220;
  const [top, bottom, left, right] = [12, height - 30, 64, WIDTH - 20];
  const chart = root(name, height);
  const all = lines.flatMap((l) => l.points.map((p) => p[1]));
  const max = yAxis(chart, Math.max(...all, 0) || 1e-9, top, bottom, left, right, format);
  const x = (t) => left + ((t - start) / Math.max(1, end - start)) * (right - left);
  const y = (v) => bottom - (v / max) * (bottom - top);
  for (const line of lines) {
    if (!line.points.length) continue;
    const d = line.points.map((p, i) => `${i ? "L" : "M"}${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join("");
    chart.appendChild(titled(svg("path", { d, fill: "none", stroke: line.color, "stroke-width": 2 }), line.name));
    const [t, v] = line.points[line.points.length - 1];
    chart.appendChild(titled(svg("circle", { cx: x(t), cy: y(v), r: 3, fill: line.color }), `${line.name}: ${format(v)}`));
  }
  timeAxis(chart, start, end, left, right, bottom);
  return chart;
}

/** A legend: [{name, color}] as swatches. */
export function legend(series) {
  const box = document.createElement("div");
  box.className = "legend";
  for (const s of series) {
    const item = document.createElement("span");
    const sw = svg("svg", { width: 10, height: 10, class: "swatch" });
    sw.appendChild(svg("rect", { width: 10, height: 10, fill: s.color }));
    item.append(sw, document.createTextNode(s.name));
    box.appendChild(item);
  }
  return box;
}
