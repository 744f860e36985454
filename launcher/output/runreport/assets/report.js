/* dtrain report: draws the curves and utilisation charts (uPlot) from the page's embedded
   data, and makes the log lines searchable. Text from the data is only ever set with
   textContent / createTextNode, never parsed as HTML. */
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("report-data").textContent);
  var PALETTE = ["#0969da", "#e16f24", "#2da44e", "#8250df", "#bf3989", "#1b7c83",
                 "#9a6700", "#cf222e", "#57606a", "#6639ba"];
  var RUN_COLORS = ["#0969da", "#e16f24"];
  var LEGEND_MAX = 12;
  var state = { x: "step", y: "mean" };
  var charts = [];

  function color(i, n) {
    if (n <= PALETTE.length) return PALETTE[i % PALETTE.length];
    return "hsl(" + Math.round((i * 360) / n) + ",62%,46%)";
  }
  function fmtT(s) {
    if (s == null) return "";
    var a = Math.abs(s), sign = s < 0 ? "-" : "";
    if (a < 60) return sign + (a < 10 && a % 1 ? a.toFixed(1) : Math.round(a)) + "s";
    if (a < 3600) return sign + Math.floor(a / 60) + "m" + pad(Math.round(a % 60)) + "s";
    return sign + Math.floor(a / 3600) + "h" + pad(Math.floor((a % 3600) / 60)) + "m";
  }
  function pad(n) { return (n < 10 ? "0" : "") + n; }
  function fmtNum(v, unit) {
    if (v == null) return "";
    if (unit === "B/s") {
      var u = ["B/s", "kB/s", "MB/s", "GB/s", "TB/s"], i = 0;
      while (Math.abs(v) >= 1000 && i < u.length - 1) { v /= 1000; i++; }
      return (Math.abs(v) >= 100 ? v.toFixed(0) : v.toPrecision(3)) + " " + u[i];
    }
    if (unit === "%") return v.toFixed(v >= 10 ? 0 : 1) + "%";
    var a = Math.abs(v);
    if (a !== 0 && (a < 1e-3 || a >= 1e6)) return v.toExponential(2);
    return String(+v.toPrecision(5));
  }
  /* y tick labels: as many decimals as the ticks' spacing needs (ticks 99.5, 100, 100.5
     must not all read "100%"; ticks 0.25 apart must not read 0.3, 0.5, 0.8: an H200's
     GPU utilisation of 0-1 %) */
  function yTicks(vals, unit) {
    var step = vals.length > 1 ? Math.abs(vals[1] - vals[0]) : 0;
    if (unit === "%" && step > 0 && isFinite(step)) {
      var d = 0;
      while (d < 4 && Math.abs(step * Math.pow(10, d) - Math.round(step * Math.pow(10, d)))
             > 1e-6 * Math.pow(10, d)) d++;
      return vals.map(function (v) { return v == null ? "" : v.toFixed(d) + "%"; });
    }
    return vals.map(function (v) { return fmtNum(v, unit); });
  }
  function el(tag, cls, txt) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (txt != null) e.textContent = txt;
    return e;
  }

  /* several series with their own x values -> one x column and aligned y columns */
  function align(list) {
    var xs = new Set();
    list.forEach(function (s) { s.x.forEach(function (x) { xs.add(x); }); });
    var xcol = Array.from(xs).sort(function (a, b) { return a - b; });
    var idx = new Map();
    xcol.forEach(function (x, i) { idx.set(x, i); });
    var cols = [xcol];
    list.forEach(function (s) {
      var col = new Array(xcol.length).fill(null);
      for (var i = 0; i < s.x.length; i++) col[idx.get(s.x[i])] = s.y[i];
      cols.push(col);
    });
    return cols;
  }

  function chart(target, title, subtitle, list, opts) {
    var box = el("div", "chart");
    var h = el("h3", null, title);
    if (subtitle) { h.appendChild(document.createTextNode(" ")); h.appendChild(el("span", "dim", subtitle)); }
    box.appendChild(h);
    target.appendChild(box);
    if (!list.length) { box.appendChild(el("p", "empty", "no points")); return; }
    var cols = align(list);
    var series = [{ label: opts.xLabel, value: function (u, v) { return opts.xTime ? fmtT(v) : v; } }];
    list.forEach(function (s) {
      series.push({ label: s.label, stroke: s.color, width: s.width || 1.5, spanGaps: true,
                    points: { show: false },
                    value: function (u, v) { return fmtNum(v, opts.unit); } });
    });
    var width = Math.max(320, box.clientWidth - 20);
    var u = new uPlot({
      width: width, height: 240,
      legend: { show: list.length <= LEGEND_MAX },
      scales: { x: { time: false } },
      cursor: { drag: { x: true, y: false } },
      series: series,
      axes: [
        { label: opts.xLabel, size: 40,
          values: function (u, vals) { return vals.map(function (v) { return opts.xTime ? fmtT(v) : v; }); } },
        /* room for the longest tick label ("123 kB/s" is wider than "100%") */
        { size: opts.unit === "B/s" ? 84 : 64,
          values: function (u, vals) { return yTicks(vals, opts.unit); } }
      ]
    }, cols, box);
    if (list.length > LEGEND_MAX) box.appendChild(el("p", "dim", list.length + " series; legend hidden (hover for values)"));
    charts.push({ u: u, box: box });
  }

  function curveSeries(run, curve, ri, nRuns) {
    var xk = state.x === "time" ? "t" : "step";
    var out = [];
    var prefix = nRuns > 1 ? run.label + ": " : "";
    if (state.y === "rank" && nRuns === 1 && curve.spread) {
      /* many ranks: their lowest and highest value per step, the mean, and the ranks
         farthest from the others (curves.py RANK_SERIES_MAX) */
      Object.keys(curve.spread).sort(function (a, b) { return a - b; }).forEach(function (a) {
        var e = curve.spread[a], m = curve.mean[a], at = a > 1 ? " a" + a : "";
        out.push({ label: "lowest rank" + at, x: e.min[xk], y: e.min.v, color: "#8c959f", width: 1.2 });
        out.push({ label: "highest rank" + at, x: e.max[xk], y: e.max.v, color: "#8c959f", width: 1.2 });
        if (m) out.push({ label: "mean" + at, x: m[xk], y: m.v, color: "#24292f", width: 2 });
      });
      curve.outliers.forEach(function (s, i) {
        out.push({ label: "r" + s.rank + (s.attempt > 1 ? " a" + s.attempt : "") + " (farthest)",
                   x: s[xk], y: s.v, color: PALETTE[i % PALETTE.length], width: 1.4 });
      });
    } else if (state.y === "rank" && nRuns === 1) {
      curve.ranks.forEach(function (s, i) {
        out.push({ label: prefix + "r" + s.rank + (s.attempt > 1 ? " a" + s.attempt : ""),
                   x: s[xk], y: s.v, color: color(i, curve.ranks.length), width: 1.2 });
      });
    } else {
      var attempts = Object.keys(curve.mean).sort(function (a, b) { return a - b; });
      attempts.forEach(function (a, i) {
        var s = curve.mean[a];
        var c = nRuns > 1 ? RUN_COLORS[ri] : color(i, attempts.length);
        out.push({ label: prefix + "mean" + (attempts.length > 1 ? " (attempt " + a + ")" : ""),
                   x: s[xk], y: s.v, color: c, width: 2 });
      });
    }
    return out;
  }

  function drawCurves() {
    var target = document.getElementById("curves");
    if (!target) return;
    target.textContent = "";
    var names = [];
    data.runs.forEach(function (r) { r.curves.forEach(function (c) { if (names.indexOf(c.name) < 0) names.push(c.name); }); });
    names.forEach(function (name) {
      var list = [], sub = [];
      var stepped = true;
      data.runs.forEach(function (run, ri) {
        var c = run.curves.filter(function (c) { return c.name === name; })[0];
        if (!c) return;
        if (!c.x_is_step) stepped = false;
        list = list.concat(curveSeries(run, c, ri, data.runs.length));
        sub.push((data.runs.length > 1 ? run.label + ": " : "") + c.points + " points" + (c.thinned ? ", thinned" : "")
                 + (state.y === "rank" && c.spread && data.runs.length === 1
                    ? " · many ranks: the lowest and highest per step, the mean, the " + c.outliers.length + " farthest" : ""));
      });
      var xLabel = state.x === "time" ? "time since start" : (stepped ? "step" : "report # (no step in the lines)");
      chart(target, name, sub.join(" · "), list, { xLabel: xLabel, xTime: state.x === "time" });
    });
  }

  function drawUsage() {
    var target = document.getElementById("usage");
    if (!target) return;
    var run = data.runs[0];
    run.usage.forEach(function (m) {
      var hosts = Object.keys(m.hosts);
      var strag = run.stragglers;
      var spread = /^(min|median|max) of \d+ nodes$/;
      var list = hosts.map(function (h, i) {
        var s = m.hosts[h], isS = strag.indexOf(h) >= 0;
        if (m.summary && spread.test(h)) {  /* many nodes: their spread (usage.page_usage) */
          var mid = h.indexOf("median") === 0;
          return { label: h, x: s.t, y: s.v, color: mid ? "#24292f" : "#8c959f",
                   width: mid ? 2 : 1.2 };
        }
        return { label: h + (isS ? " (straggler)" : ""), x: s.t, y: s.v,
                 color: isS ? "#cf222e" : (strag.length ? "#8c959f" : color(i, hosts.length)),
                 width: isS ? 2.6 : 1.3 };
      });
      var unit = m.unit === "B/s" ? "bytes per second" : m.unit;
      chart(target, m.title, m.summary ? unit + " · " + m.summary : unit, list,
            { xLabel: "time since start", xTime: true, unit: m.unit });
    });
  }

  function controls() {
    var box = document.getElementById("curve-controls");
    if (!box) return;
    box.addEventListener("click", function (ev) {
      var b = ev.target;
      if (!b || b.tagName !== "BUTTON") return;
      var key = b.dataset.x ? "x" : "y";
      state[key] = b.dataset[key];
      box.querySelectorAll("button[data-" + key + "]").forEach(function (o) {
        o.classList.toggle("on", o === b);
      });
      charts = charts.filter(function (c) {
        if (document.getElementById("curves").contains(c.box)) { c.u.destroy(); return false; }
        return true;
      });
      drawCurves();
    });
  }

  function search() {
    var input = document.getElementById("q");
    if (!input) return;
    var items = Array.prototype.slice.call(document.querySelectorAll("ol.log li"));
    var original = items.map(function (li) { return li.querySelector(".tx").textContent; });
    var count = document.getElementById("qcount");
    var timer = null;
    function matcher(q) {
      var m = /^\/(.+)\/([a-z]*)$/.exec(q);
      if (m) {
        try { var rx = new RegExp(m[1], m[2].indexOf("i") >= 0 ? "gi" : "g"); return rx; }
        catch (e) { return null; }
      }
      return new RegExp(q.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"), "gi");
    }
    function run() {
      var q = input.value;
      var rx = q ? matcher(q) : null;
      var hits = 0;
      items.forEach(function (li, i) {
        var tx = li.querySelector(".tx"), s = original[i];
        tx.textContent = "";
        if (!q || !rx) { tx.textContent = s; li.classList.remove("hidden"); return; }
        rx.lastIndex = 0;
        var last = 0, m, any = false;
        while ((m = rx.exec(s)) !== null) {
          if (m[0] === "") { rx.lastIndex++; continue; }
          any = true;
          tx.appendChild(document.createTextNode(s.slice(last, m.index)));
          tx.appendChild(el("mark", null, m[0]));
          last = m.index + m[0].length;
        }
        tx.appendChild(document.createTextNode(s.slice(last)));
        li.classList.toggle("hidden", !any);
        if (any) {
          hits++;
          var d = li.closest("details");
          if (d) d.open = true;
        }
      });
      count.textContent = q ? (rx ? hits + " matching lines" : "invalid regular expression") : "";
    }
    input.addEventListener("input", function () { clearTimeout(timer); timer = setTimeout(run, 120); });
  }

  function resize() {
    charts.forEach(function (c) {
      c.u.setSize({ width: Math.max(320, c.box.clientWidth - 20), height: 240 });
    });
  }

  /* each log shown at its end: the lists on screen only (a folded node's is scrolled when it
     is opened), every height read before any is written: one layout, not one per node */
  function toEnd(lists) {
    var hs = lists.map(function (ol) { return ol.scrollHeight; });
    lists.forEach(function (ol, i) { ol.scrollTop = hs[i]; });
  }
  toEnd(Array.prototype.filter.call(document.querySelectorAll("ol.log"), function (ol) {
    var d = ol.closest("details");
    return !d || d.open;
  }));
  document.addEventListener("toggle", function (ev) {
    var d = ev.target;
    if (d.open && d.querySelectorAll) toEnd(Array.prototype.slice.call(d.querySelectorAll("ol.log")));
  }, true);
  drawCurves();
  drawUsage();
  controls();
  search();
  var rt = null;
  window.addEventListener("resize", function () { clearTimeout(rt); rt = setTimeout(resize, 150); });
  // when the page was drawn, from navigation start (bench/bench_report.py --browser)
  document.documentElement.dataset.readyMs = String(Math.round(performance.now()));
  document.documentElement.dataset.ready = "1";
})();
