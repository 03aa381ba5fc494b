/* app.js - the nsad dashboard: polls the JSON API (proto/api.md) and draws
 * the run header, live charts (uPlot), events and config.
 *
 * No framework and no build step: the page must work offline under a strict
 * CSP (no inline script or style), so everything is plain DOM. Metrics are
 * fetched incrementally with the API's since-cursor and appended to
 * column arrays that the charts read directly; nothing is reloaded whole. */
(function () {
  'use strict';

  var API = '/api/v1';
  var TOKEN_KEY = 'nsad.token';
  var THEME_KEY = 'nsad.theme';
  var SMOOTH_KEY = 'nsad.smoothing';
  var XMODE_KEY = 'nsad.xmode';

  var POLL_ACTIVE_MS = 1000;   /* a run that moves */
  var POLL_IDLE_MS = 2500;     /* a finished or halted run (it may be resumed) */
  var POLL_HIDDEN_MS = 10000;  /* the tab is in the background */
  var RUNS_EVERY_MS = 5000;    /* the run list changes rarely */
  var EVENTS_EVERY_MS = 3000;
  var HEARTBEAT_STALE_S = 30;
  var MAX_EVENTS_SHOWN = 300;
  var MAX_METRIC_PAGES = 100;  /* per tick, when the API pages a long history */
  var METRICS_PAGE_ROWS = 10000; /* the API's most rows of a kind per answer */

  /* Run states and what they allow, from proto/api.md. */
  var ACTIVE_STATES = { starting: 1, running: 1, halting: 1, hung: 1 };
  var HALTABLE_STATES = { starting: 1, running: 1, hung: 1 };
  var RESUMABLE_STATES = { halted: 1, nan_halted: 1, failed: 1 };
  /* The tokenizers nsad encodes and decodes text with (daemon/tokenizer.c):
   * a run's model has a text form only with one of these; any other
   * (token shards of gpt2, of a vocabulary of its own) is sampled by token
   * ids. Prompt limits from proto/api.md, POST /api/v1/sample. */
  var TEXT_TOKENIZERS = { byte: 1 };
  var MAX_PROMPT_IDS = 65536;
  var MAX_TOKEN_ID = 16777215;  /* 2^24 - 1 */
  var STATE_LABELS = {
    idle: 'idle', starting: 'starting', running: 'running', halting: 'halting',
    halted: 'halted', completed: 'completed', failed: 'failed',
    nan_halted: 'NaN halted', hung: 'hung', queued: 'queued'
  };

  function $(id) { return document.getElementById(id); }

  /* ---- formatting -------------------------------------------------------- */

  function isNum(v) { return typeof v === 'number' && isFinite(v); }

  function fmtFixed(v, digits) { return isNum(v) ? v.toFixed(digits) : '—'; }

  function fmtSig(v) {
    if (!isNum(v)) return '—';
    var a = Math.abs(v);
    if (a !== 0 && (a < 1e-3 || a >= 1e6)) return v.toExponential(2);
    return String(+v.toPrecision(4));
  }

  function fmtSI(v) {
    if (!isNum(v)) return '—';
    var a = Math.abs(v);
    if (a >= 1e9) return (v / 1e9).toFixed(2) + 'G';
    if (a >= 1e6) return (v / 1e6).toFixed(2) + 'M';
    if (a >= 1e4) return (v / 1e3).toFixed(1) + 'k';
    if (a >= 1e3) return (v / 1e3).toFixed(2) + 'k';
    return String(+v.toPrecision(3));
  }

  function fmtLr(v) {
    if (!isNum(v)) return '—';
    if (v === 0) return '0';
    return v < 0.01 ? v.toExponential(2) : String(+v.toPrecision(3));
  }

  function fmtBytes(v) {
    if (!isNum(v)) return '—';
    var units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    var i = 0;
    while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return (i === 0 ? String(Math.round(v)) : String(+v.toFixed(v >= 100 ? 0 : 1))) + ' ' + units[i];
  }

  function fmtDuration(s) {
    if (!isNum(s) || s < 0) return '—';
    s = Math.round(s);
    var d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600),
        m = Math.floor(s % 3600 / 60), sec = s % 60;
    function two(n) { return (n < 10 ? '0' : '') + n; }
    if (d > 0) return d + 'd ' + two(h) + 'h';
    if (h > 0) return h + 'h ' + two(m) + 'm';
    if (m > 0) return m + 'm ' + two(sec) + 's';
    return sec + 's';
  }

  function fmtClock(ts) {
    if (!isNum(ts)) return '';
    var d = new Date(ts * 1000);
    var now = new Date();
    var opts = { hour: '2-digit', minute: '2-digit', second: '2-digit', hour12: false };
    if (d.toDateString() !== now.toDateString()) { opts.month = 'short'; opts.day = 'numeric'; }
    return d.toLocaleString(undefined, opts);
  }

  /* ---- token (bearer auth for TCP access) ------------------------------------ */

  /* `nsactl dashboard` prints URL#token=...: keep the token for this tab only
   * and take it out of the address bar so it does not end up in history,
   * bookmarks or screenshots. */
  function adoptTokenFromHash() {
    var hash = location.hash.replace(/^#/, '');
    if (!hash) return;
    var kept = [];
    hash.split('&').forEach(function (part) {
      var eq = part.indexOf('=');
      var key = eq < 0 ? part : part.slice(0, eq);
      if (key === 'token') {
        var value = '';
        try { value = decodeURIComponent(part.slice(eq + 1)); } catch (e) { value = ''; }
        if (value) sessionStorage.setItem(TOKEN_KEY, value);
      } else if (part) {
        kept.push(part);
      }
    });
    var rest = kept.length ? '#' + kept.join('&') : '';
    history.replaceState(null, '', location.pathname + location.search + rest);
  }

  function getToken() { return sessionStorage.getItem(TOKEN_KEY) || ''; }

  /* ---- API ----------------------------------------------------------------- */

  function ApiError(status, code, message) {
    this.status = status;
    this.code = code;
    this.message = message;
  }

  /* Resolves to the parsed JSON body; rejects with an ApiError carrying the
   * API's {"error":{"code","message"}} (or the HTTP status when the body is
   * not that shape; status 0 when the daemon is unreachable). */
  function api(method, path, body) {
    var headers = { 'Accept': 'application/json' };
    var token = getToken();
    if (token) headers['Authorization'] = 'Bearer ' + token;
    var init = { method: method, headers: headers, cache: 'no-store', credentials: 'same-origin' };
    if (body !== undefined) {
      headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    return fetch(API + path, init).then(function (res) {
      noteServerClock(res.headers.get('Date'));
      return res.text().then(function (text) {
        var data = null;
        if (text) {
          try { data = JSON.parse(text); } catch (e) { data = null; }
        }
        if (!res.ok) {
          var err = data && data.error;
          throw new ApiError(res.status, err && err.code ? String(err.code) : 'http_' + res.status,
                             err && err.message ? String(err.message) : 'HTTP ' + res.status + ' ' + res.statusText);
        }
        if (data === null && text) throw new ApiError(res.status, 'bad_json', 'the daemon sent a body that is not JSON');
        return data || {};
      });
    }, function (e) {
      throw new ApiError(0, 'unreachable', 'cannot reach nsad (' + (e && e.message ? e.message : 'network error') + ')');
    });
  }

  /* The elapsed time of a live run is now minus its start on the daemon's
   * clock; a browser on another machine may be minutes off. The HTTP Date
   * header has whole seconds, so a difference under 2 s counts as none. */
  var serverClockSkew = 0;
  function noteServerClock(dateHeader) {
    var t = dateHeader ? Date.parse(dateHeader) : NaN;
    if (!isNum(t)) return;
    var skew = (Date.now() - t) / 1000 - 0.5;
    serverClockSkew = Math.abs(skew) < 2 ? 0 : skew;
  }

  /* ---- metric store ---------------------------------------------------------- */

  /* Columns, one array per field, in step order; the charts read them as is. */
  function newStore() {
    return {
      train: { step: [], ts: [], loss: [], ema: [], lr: [], grad_norm: [], toks_per_s: [], mem_bytes: [] },
      val: { step: [], ts: [], val_loss: [], bpb: [] },
      emaLast: 0,
      emaCount: 0,
      emaDone: 0            /* train rows already folded into the average */
    };
  }

  function num(v) { return isNum(v) ? v : null; }

  /* Drops the tail of every column from index i on. */
  function truncateColumns(cols, i) {
    Object.keys(cols).forEach(function (k) { cols[k].length = i; });
  }

  /* Index of the first entry whose step is >= step (binary search). */
  function lowerBound(steps, step) {
    var lo = 0, hi = steps.length;
    while (lo < hi) {
      var mid = (lo + hi) >> 1;
      if (steps[mid] < step) lo = mid + 1; else hi = mid;
    }
    return lo;
  }

  /* Appends samples; a step at or before the last one (a rollback or a
   * resume from an older checkpoint) replaces the history from that step on,
   * so the curve shows what the model really went through last. Returns true
   * when earlier points were replaced. */
  function appendTrain(store, rows, smoothing) {
    var t = store.train, rewound = false;
    rows.forEach(function (r) {
      if (!r || !isNum(r.step)) return;
      var n = t.step.length;
      if (n && r.step <= t.step[n - 1]) {
        truncateColumns(t, lowerBound(t.step, r.step));
        rewound = true;
      }
      t.step.push(r.step);
      t.ts.push(num(r.ts));
      t.loss.push(num(r.loss));
      t.lr.push(num(r.lr));
      t.grad_norm.push(num(r.grad_norm));
      t.toks_per_s.push(num(r.toks_per_s));
      t.mem_bytes.push(num(r.mem_bytes));
      t.ema.push(null);
    });
    if (rewound) recomputeEma(store, smoothing);
    else extendEma(store, smoothing);
    return rewound;
  }

  function appendVal(store, rows) {
    var v = store.val;
    rows.forEach(function (r) {
      if (!r || !isNum(r.step)) return;
      var n = v.step.length;
      if (n && r.step <= v.step[n - 1]) truncateColumns(v, lowerBound(v.step, r.step));
      v.step.push(r.step);
      v.ts.push(num(r.ts));
      v.val_loss.push(num(r.val_loss));
      v.bpb.push(num(r.bits_per_byte));
    });
  }

  /* Debiased exponential moving average (as TensorBoard draws it): the
   * zero start is divided out, so the first points are not dragged to 0.
   * Non-finite losses leave a gap and do not poison the average. */
  function extendEma(store, w) {
    var t = store.train;
    for (var i = store.emaDone; i < t.loss.length; i++) {
      var v = t.loss[i];
      if (v === null) { t.ema[i] = null; continue; }
      store.emaLast = store.emaLast * w + (1 - w) * v;
      store.emaCount++;
      var debias = 1 - Math.pow(w, store.emaCount);
      t.ema[i] = debias > 0 ? store.emaLast / debias : v;
    }
    store.emaDone = t.loss.length;
  }

  function recomputeEma(store, w) {
    var t = store.train;
    store.emaLast = 0;
    store.emaCount = 0;
    store.emaDone = 0;
    for (var i = 0; i < t.ema.length; i++) t.ema[i] = null;
    extendEma(store, w);
  }

  /* ---- charts ------------------------------------------------------------------ */

  function cssVar(name) {
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  }

  function withAlpha(color, alpha) {
    var m = /^#([0-9a-f]{2})([0-9a-f]{2})([0-9a-f]{2})$/i.exec(color);
    if (!m) return color;
    return 'rgba(' + parseInt(m[1], 16) + ',' + parseInt(m[2], 16) + ',' + parseInt(m[3], 16) + ',' + alpha + ')';
  }

  /* What each chart shows: which store part and columns, how to print values. */
  var CHART_SPECS = [
    { id: 'chart-loss', part: 'train', empty: 'waiting for the first logged step…',
      series: [
        { label: 'loss', col: 'loss', color: '--series-1', alpha: 0.4, width: 1, fmt: function (v) { return fmtFixed(v, 4); } },
        { label: 'smoothed', col: 'ema', color: '--series-1', width: 2, fmt: function (v) { return fmtFixed(v, 4); } }
      ], axis: function (v) { return fmtSig(v); } },
    { id: 'chart-val', part: 'val', empty: 'no evaluation yet',
      series: [
        { label: 'val loss', col: 'val_loss', color: '--series-2', width: 2, points: true, fmt: function (v) { return fmtFixed(v, 4); } },
        { label: 'bits/byte', col: 'bpb', color: '--series-4', width: 1.5, points: true, dash: [5, 4], scale: 'bpb', fmt: function (v) { return fmtFixed(v, 4); } }
      ], axis: function (v) { return fmtSig(v); }, rightAxis: 'bpb' },
    { id: 'chart-tps', part: 'train', empty: 'waiting for data…',
      series: [{ label: 'tok/s', col: 'toks_per_s', color: '--series-3', width: 1.5, fill: true, fmt: fmtSI }],
      axis: fmtSI, zeroBased: true },
    { id: 'chart-lr', part: 'train', empty: 'waiting for data…',
      series: [{ label: 'lr', col: 'lr', color: '--series-4', width: 2, fmt: fmtLr }],
      axis: fmtLr, zeroBased: true },
    { id: 'chart-gn', part: 'train', empty: 'waiting for data…',
      series: [{ label: 'grad norm', col: 'grad_norm', color: '--series-5', width: 1.5, fmt: fmtSig }],
      axis: fmtSig, zeroBased: true },
    { id: 'chart-mem', part: 'train', empty: 'waiting for data…',
      series: [{ label: 'memory', col: 'mem_bytes', color: '--series-6', width: 2, fill: true, fmt: fmtBytes }],
      axis: fmtBytes, zeroBased: true, incrs: binaryIncrements() }
  ];

  /* Tick steps for the step axis: whole steps only (1, 2, 5, 10, 20...). */
  var STEP_INCREMENTS = (function () {
    var out = [];
    for (var p = 1; p <= 1e12; p *= 10) out.push(p, 2 * p, 5 * p);
    return out;
  })();

  /* Tick steps for byte axes: powers of two, so ticks land on 64 MiB,
   * 1 GiB... instead of 47.7 MiB. */
  function binaryIncrements() {
    var out = [];
    for (var e = 0; e <= 50; e++) out.push(Math.pow(2, e));
    return out;
  }

  function chartHeight() { return window.innerWidth < 560 ? 170 : 210; }

  function chartWidth(fig) { return Math.max(200, Math.floor(fig.clientWidth)); }

  function buildChart(spec, xmode) {
    var fig = $(spec.id);
    var axisColor = cssVar('--axis'), gridColor = cssVar('--grid');
    var time = xmode === 'time';
    var series = [{
      label: time ? 'time' : 'step',
      value: time ? function (u, v) { return v == null ? '—' : fmtClock(v); }
                  : function (u, v) { return v == null ? '—' : String(v); }
    }];
    spec.series.forEach(function (s) {
      var color = cssVar(s.color);
      var stroke = s.alpha ? withAlpha(color, s.alpha) : color;
      series.push({
        label: s.label,
        scale: s.scale || 'y',
        stroke: stroke,
        width: s.width,
        dash: s.dash,
        fill: s.fill ? withAlpha(color, 0.12) : undefined,
        spanGaps: false,
        points: s.points ? { show: true, size: 6, fill: color } : { show: false },
        value: function (u, v) { return v == null ? '—' : s.fmt(v); }
      });
    });
    /* Room for the widest tick label (uPlot's fixed default clips "3.00e-4"). */
    function axisSize(u, values, axisIdx, cycleNum) {
      var axis = u.axes[axisIdx];
      if (cycleNum > 1 && axis._size) return axis._size;
      var widest = 0;
      u.ctx.font = axis.font[0];
      (values || []).forEach(function (v) {
        if (v) widest = Math.max(widest, u.ctx.measureText(v).width);
      });
      return Math.ceil(widest / (window.devicePixelRatio || 1)) + axis.gap + axis.ticks.size + 6;
    }
    function axisValues(fmt) {
      return function (u, splits) { return splits.map(function (v) { return v == null ? '' : fmt(v); }); };
    }
    var axes = [
      { stroke: axisColor, grid: { stroke: gridColor, width: 1 }, ticks: { stroke: gridColor, width: 1 },
        values: time ? undefined : axisValues(function (v) { return fmtSI(v); }),
        incrs: time ? undefined : STEP_INCREMENTS },
      { stroke: axisColor, grid: { stroke: gridColor, width: 1 }, ticks: { stroke: gridColor, width: 1 },
        size: axisSize, values: axisValues(spec.axis), incrs: spec.incrs }
    ];
    var scales = { x: { time: time } };
    if (spec.zeroBased) {
      scales.y = { range: function (u, min, max) {
        if (min == null || max == null) return [0, 1];
        var top = max > 0 ? max * 1.08 : 1;
        return [Math.min(0, min), top];
      } };
    }
    if (spec.rightAxis) {
      axes.push({ scale: spec.rightAxis, side: 1, stroke: axisColor, grid: { show: false },
                  ticks: { stroke: gridColor, width: 1 }, size: axisSize, values: axisValues(spec.axis) });
    }
    var opts = {
      width: chartWidth(fig),
      height: chartHeight(),
      series: series,
      axes: axes,
      scales: scales,
      legend: { live: true },
      cursor: { sync: { key: 'nsad-' + xmode }, drag: { x: true, y: false } },
      hooks: {
        setSelect: [function (u) { if (u.select.width > 0) chart.zoomed = true; }],
        setCursor: [function (u) { if (u.cursor.idx == null) showLatestInLegend(u); }]
      }
    };
    var chart = { spec: spec, fig: fig, zoomed: false, plot: null, empty: null };
    chart.plot = new uPlot(opts, emptyData(spec), fig);
    /* uPlot zooms out on double click; from then on follow new data again. */
    chart.plot.over.addEventListener('dblclick', function () { chart.zoomed = false; });
    var empty = document.createElement('div');
    empty.className = 'nodata';
    empty.textContent = spec.empty;
    fig.appendChild(empty);
    chart.empty = empty;
    return chart;
  }

  /* With the cursor off the chart the legend shows the newest point, so
   * each chart doubles as a readout. */
  function showLatestInLegend(u) {
    var n = u.data[0].length;
    if (n > 0) u.setLegend({ idx: n - 1 }, false);
  }

  function emptyData(spec) {
    var data = [[]];
    spec.series.forEach(function () { data.push([]); });
    return data;
  }

  function chartData(spec, store, xmode) {
    var cols = store[spec.part];
    var data = [xmode === 'time' ? cols.ts : cols.step];
    spec.series.forEach(function (s) { data.push(cols[s.col]); });
    return data;
  }

  /* ---- the page ---------------------------------------------------------------- */

  var S = {
    runs: [],
    runId: null,
    pinned: false,        /* the user chose this run (picker or ?run=): do not follow the active one */
    status: null,
    store: newStore(),
    cursor: 0,            /* metrics: the API's `next` */
    generation: null,     /* metrics: the series generation last seen */
    events: [],
    eventsNext: 0,        /* events: the API's `next` seq */
    eventsDue: true,      /* fetch events on the next poll, however recent the last */
    eventsAt: 0,          /* Date.now() of the last events and run-list fetches */
    runsAt: 0,
    gen: 0,               /* bumps on run switch; answers for an older run are dropped */
    timer: null,
    needToken: false,
    charts: [],
    xmode: localStorage.getItem(XMODE_KEY) === 'time' ? 'time' : 'step',
    smoothing: 0.6,
    configKey: '',
    busy: false,          /* a halt/resume request is in flight */
    sampleAbort: null,    /* the sample request in flight */
    sampleMode: 'text',   /* the sample box's prompt as the user picked it: 'text' or 'ids' */
    sampleModel: { text: null, tokenizer: null, vocab: null },  /* sampleModelOf the run's config */
    sampleModelKey: ''
  };

  (function loadSmoothing() {
    var v = parseFloat(localStorage.getItem(SMOOTH_KEY));
    if (isNum(v) && v >= 0 && v <= 0.99) S.smoothing = v;
  })();

  /* The banner has two sources: polling (cleared by the next good poll)
   * and the Halt/Resume buttons (kept until the next button press, so that
   * a refused action stays readable). */
  var bannerSource = '';
  function showError(msg, source) {
    source = source || 'poll';
    var b = $('error-banner');
    if (!msg) {
      if (bannerSource && bannerSource !== source) return;
      b.hidden = true;
      b.textContent = '';
      bannerSource = '';
      return;
    }
    if (bannerSource === 'action' && source === 'poll') return;
    b.textContent = msg;
    b.hidden = false;
    b.dataset.source = source;
    bannerSource = source;
  }

  function setConn(ok, text) {
    var c = $('conn');
    c.dataset.ok = ok ? '1' : '0';
    c.textContent = text;
  }

  function destroyCharts() {
    S.charts.forEach(function (c) {
      c.plot.destroy();
      if (c.empty && c.empty.parentNode) c.empty.parentNode.removeChild(c.empty);
    });
    S.charts = [];
  }

  function rebuildCharts() {
    destroyCharts();
    if ($('charts-card').hidden) return;
    S.charts = CHART_SPECS.map(function (spec) { return buildChart(spec, S.xmode); });
    refreshCharts();
  }

  function refreshCharts() {
    S.charts.forEach(function (c) {
      var data = chartData(c.spec, S.store, S.xmode);
      c.plot.setData(data, !c.zoomed);
      if (c.plot.cursor.idx == null) showLatestInLegend(c.plot);
      var hasPoint = data[1].some(function (v) { return v !== null; }) ||
                     (data[2] && data[2].some(function (v) { return v !== null; }));
      c.empty.hidden = hasPoint;
      c.fig.dataset.points = String(data[0].length);
    });
  }

  function resizeCharts() {
    var h = chartHeight();
    S.charts.forEach(function (c) { c.plot.setSize({ width: chartWidth(c.fig), height: h }); });
  }

  function resetRunView() {
    S.gen++;
    S.status = null;
    S.store = newStore();
    S.cursor = 0;
    S.generation = null;
    S.events = [];
    S.eventsNext = 0;
    S.eventsDue = true;
    $('events-empty').hidden = false;
    S.configKey = '';
    $('events').textContent = '';
    $('config').textContent = '';
    $('anomaly').hidden = true;
    resetSamples();
  }

  function selectRun(id, pushUrl) {
    if (id === S.runId) return;
    S.runId = id;
    resetRunView();
    if (pushUrl) {
      var url = new URL(location.href);
      if (id) url.searchParams.set('run', id); else url.searchParams.delete('run');
      history.replaceState(null, '', url.pathname + url.search + url.hash);
    }
    showRunSections(!!id);
    rebuildCharts();
    pollSoon();
  }

  function showRunSections(show) {
    ['run-card', 'charts-card', 'samples-card', 'events-card', 'config-card'].forEach(function (id) { $(id).hidden = !show; });
  }

  /* The run to show when the user has not picked one: a live run first,
   * else the most recently created. */
  function defaultRun(runs) {
    var live = runs.filter(function (r) { return ACTIVE_STATES[r.state]; });
    var pool = live.length ? live : runs;
    var best = null;
    pool.forEach(function (r) {
      if (!best || runCreated(r) > runCreated(best)) best = r;
    });
    return best ? best.id : null;
  }

  function runCreated(r) { return r.created_at || r.started_at || 0; }

  /* "name (id)" when the run was given a name, else the id. */
  function runLabel(r) {
    return r.name && r.name !== r.id ? r.name + ' (' + r.id + ')' : String(r.id);
  }

  function renderPicker() {
    var sel = $('run-select');
    var runs = S.runs.slice().sort(function (a, b) { return runCreated(b) - runCreated(a); });
    var key = JSON.stringify(runs.map(function (r) { return [r.id, r.state]; }));
    if (sel.dataset.key !== key) {
      sel.textContent = '';
      runs.forEach(function (r) {
        var o = document.createElement('option');
        o.value = r.id;
        o.textContent = runLabel(r) + ' — ' + (STATE_LABELS[r.state] || r.state);
        sel.appendChild(o);
      });
      sel.dataset.key = key;
    }
    sel.value = S.runId || '';
    $('picker').hidden = runs.length < 2;
  }

  function refreshRuns() {
    var gen = S.gen;
    return api('GET', '/runs').then(function (data) {
      var runs = Array.isArray(data.runs) ? data.runs.filter(function (r) { return r && r.id; }) : [];
      S.runs = runs;
      $('empty-card').hidden = runs.length > 0;
      if (gen !== S.gen) return;
      var active = typeof data.active === 'string' && data.active ? data.active : null;
      var wanted = S.runId;
      if (!wanted) {
        wanted = new URL(location.href).searchParams.get('run');
        if (wanted) S.pinned = true;
      }
      var known = runs.some(function (r) { return r.id === wanted; });
      /* runs training side by side (disjoint GPUs): all of them, newest first */
      var actives = Array.isArray(data.active_runs) ? data.active_runs : (active ? [active] : []);
      /* Unless the user picked a run, show the active run shown already, else
       * the newest active one, else the newest run, so a page left open
       * follows the daemon to the next run without hopping between runs
       * that train at once. */
      if (!known || !S.pinned) {
        wanted = known && actives.indexOf(wanted) >= 0 ? wanted : active || defaultRun(runs);
      }
      if (!known) S.pinned = false;
      if (wanted !== S.runId) selectRun(wanted, false);
      renderPicker();
      renderRunsTable();
    });
  }

  /* ---- the runs table and the comparison of runs ---------------------------------- */

  /* Runs picked in the table (ids, in the order picked) overlay their
   * training loss and validation bits/byte on two charts that share the x
   * range: by step, by wall time since the run's first logged point, or by
   * tokens trained on. Each run's series are fetched whole once, then from
   * its cursor while it moves; a new generation (a resume or a rollback
   * replaced points) refetches it. */
  var CMP_KEY = 'nsad.compare';
  var CMP_XMODE_KEY = 'nsad.compare.xmode';
  var CMP_LOG_KEY = 'nsad.compare.log';
  var CMP_COLORS = ['--series-1', '--series-2', '--series-3', '--series-4', '--series-5', '--series-6'];
  var CMP_XLABEL = { step: 'step', time: 'elapsed_s', tokens: 'tokens' };

  var C = {
    picked: [],           /* run ids, in the order picked */
    data: {},             /* id -> { cursor, generation, train: {step, ts, tokens, loss}, val: {...} } */
    xmode: 'step',
    log: false,
    charts: null,         /* { loss, val } uPlot wrappers while runs are picked */
    zoom: null,           /* [min, max] the user dragged, shared by both charts */
    syncing: false
  };

  (function loadCompare() {
    try {
      var picked = JSON.parse(localStorage.getItem(CMP_KEY) || '[]');
      if (Array.isArray(picked)) C.picked = picked.filter(function (x) { return typeof x === 'string'; });
    } catch (e) { C.picked = []; }
    var x = localStorage.getItem(CMP_XMODE_KEY);
    if (x === 'time' || x === 'tokens') C.xmode = x;
    C.log = localStorage.getItem(CMP_LOG_KEY) === '1';
  })();

  function fmtPct(v) { return isNum(v) ? (100 * v).toFixed(1) + '%' : '—'; }

  function fmtDate(ts) {
    if (!isNum(ts) || ts <= 0) return '—';
    var d = new Date(ts * 1000);
    function two(n) { return (n < 10 ? '0' : '') + n; }
    return d.getFullYear() + '-' + two(d.getMonth() + 1) + '-' + two(d.getDate()) + ' ' +
           two(d.getHours()) + ':' + two(d.getMinutes());
  }

  /* How long the run has trained: to its end, or to now while active. */
  function runDuration(r) {
    if (!isNum(r.started_at) || r.started_at <= 0) return null;
    var end = isNum(r.ended_at) && r.ended_at > 0 ? r.ended_at : (ACTIVE_STATES[r.state] ? Date.now() / 1000 : null);
    return end == null ? null : Math.max(0, end - r.started_at);
  }

  function runColor(id) {
    var i = C.picked.indexOf(id);
    return i < 0 ? '' : cssVar(CMP_COLORS[i % CMP_COLORS.length]);
  }

  function runById(id) {
    for (var i = 0; i < S.runs.length; i++) if (S.runs[i].id === id) return S.runs[i];
    return null;
  }

  function pickedKey() {
    return JSON.stringify(C.picked.map(function (id) { var r = runById(id); return r ? runLabel(r) : id; })) + C.xmode + C.log;
  }

  function renderRunsTable() {
    if (C.picked.length && C.builtKey !== pickedKey()) rebuildCompare();
    var body = $('runs-body');
    var runs = S.runs.slice().sort(function (a, b) { return runCreated(b) - runCreated(a); });
    $('runs-card').hidden = runs.length === 0;
    body.textContent = '';
    runs.forEach(function (r) {
      var tr = document.createElement('tr');
      tr.dataset.run = r.id;
      if (r.id === S.runId) tr.dataset.current = '1';
      var pick = document.createElement('td');
      var box = document.createElement('input');
      box.type = 'checkbox';
      box.className = 'cmp-pick';
      box.value = r.id;
      box.checked = C.picked.indexOf(r.id) >= 0;
      box.setAttribute('aria-label', 'compare ' + runLabel(r));
      box.addEventListener('change', function () { togglePick(r.id, box.checked); });
      pick.appendChild(box);
      if (box.checked) {
        var sw = document.createElement('span');
        sw.className = 'swatch';
        sw.style.setProperty('--c', runColor(r.id));
        pick.appendChild(sw);
      }
      tr.appendChild(pick);
      var stateCell = document.createElement('td');
      var badge = document.createElement('span');
      badge.className = 'state';
      badge.dataset.state = r.state;
      badge.textContent = (STATE_LABELS[r.state] || r.state) +
                          (r.state === 'queued' && isNum(r.queue_position) ? ' #' + r.queue_position : '');
      stateCell.appendChild(badge);
      tr.appendChild(stateCell);
      var nameCell = document.createElement('td');
      var link = document.createElement('button');
      link.type = 'button';
      link.className = 'run-link';
      link.textContent = runLabel(r);
      link.addEventListener('click', function () { S.pinned = true; selectRun(r.id, true); renderRunsTable(); pollSoon(); });
      nameCell.appendChild(link);
      tr.appendChild(nameCell);
      var step = isNum(r.step) ? r.step.toLocaleString() + (isNum(r.total_steps) ? ' / ' + r.total_steps.toLocaleString() : '') : '—';
      [step, fmtFixed(r.loss, 4), fmtFixed(r.bits_per_byte, 4), fmtSI(r.toks_per_s), fmtPct(r.mfu),
       fmtDate(r.started_at), fmtDuration(runDuration(r))].forEach(function (text, i) {
        var td = document.createElement('td');
        td.textContent = text;
        td.className = 'col-' + ['step', 'loss', 'bpb', 'tps', 'mfu', 'started', 'duration'][i];
        tr.appendChild(td);
      });
      body.appendChild(tr);
    });
  }

  function savePicked() { localStorage.setItem(CMP_KEY, JSON.stringify(C.picked)); }

  function togglePick(id, on) {
    var i = C.picked.indexOf(id);
    if (on && i < 0) C.picked.push(id);
    if (!on && i >= 0) { C.picked.splice(i, 1); delete C.data[id]; }
    savePicked();
    C.zoom = null;
    rebuildCompare();
    renderRunsTable();
    refreshCompare().then(drawCompare, handleFailure);
  }

  function newSeries() {
    return { train: { step: [], ts: [], tokens: [], loss: [] }, val: { step: [], ts: [], tokens: [], bpb: [] } };
  }

  /* Fetches what is new of one picked run (all of it after a generation
   * change), paging through a long history. */
  function fetchCompareRun(id) {
    var d = C.data[id];
    if (!d) d = C.data[id] = { cursor: 0, generation: null, series: newSeries() };
    function page(n) {
      return api('GET', '/runs/' + encodeURIComponent(id) + '/metrics?since=' + d.cursor).then(function (m) {
        if (!C.data[id]) return;  /* unpicked meanwhile */
        if (d.generation !== null && m.generation !== d.generation) {
          d.cursor = 0;
          d.generation = m.generation;
          d.series = newSeries();
          return page(n + 1);
        }
        d.generation = m.generation;
        var t = d.series.train, v = d.series.val;
        (m.train || []).forEach(function (p) {
          if (t.step.length && p.step <= t.step[t.step.length - 1]) return;
          t.step.push(p.step); t.ts.push(num(p.ts)); t.tokens.push(num(p.tokens)); t.loss.push(num(p.loss));
        });
        (m.val || []).forEach(function (p) {
          if (v.step.length && p.step <= v.step[v.step.length - 1]) return;
          v.step.push(p.step); v.ts.push(num(p.ts)); v.tokens.push(num(p.tokens)); v.bpb.push(num(p.bits_per_byte));
        });
        var more = isNum(m.next) && m.next > d.cursor &&
                   ((m.train || []).length >= METRICS_PAGE_ROWS || (m.val || []).length >= METRICS_PAGE_ROWS);
        if (isNum(m.next)) d.cursor = Math.max(d.cursor, m.next);
        if (more && n < MAX_METRIC_PAGES) return page(n + 1);
      });
    }
    return page(0);
  }

  /* Refetches the picked runs that can still change (active, queued, or
   * never fetched); drops picks of runs that are gone. */
  function refreshCompare() {
    if (S.runs.length) {
      var before = C.picked.length;
      C.picked = C.picked.filter(function (id) { return !!runById(id); });
      if (C.picked.length !== before) { savePicked(); rebuildCompare(); }
    }
    var due = C.picked.filter(function (id) {
      var r = runById(id);
      return !C.data[id] || C.data[id].generation === null || !r || ACTIVE_STATES[r.state] ||
             (isNum(r.step) && C.data[id].series.train.step.length &&
              r.step > C.data[id].series.train.step[C.data[id].series.train.step.length - 1]);
    });
    return Promise.all(due.map(fetchCompareRun));
  }

  /* One run's points of a part on the current x axis: [xs, ys], x ascending,
   * points without an x (tokens not known) left out. */
  function comparePoints(id, part, col) {
    var d = C.data[id];
    if (!d) return [[], []];
    var s = d.series[part];
    var t0 = null;
    if (C.xmode === 'time') {
      var tt = d.series.train.ts, vt = d.series.val.ts;
      [tt[0], vt[0]].forEach(function (v) { if (isNum(v) && (t0 === null || v < t0)) t0 = v; });
    }
    var xs = [], ys = [];
    for (var i = 0; i < s.step.length; i++) {
      var x = C.xmode === 'step' ? s.step[i] : C.xmode === 'tokens' ? s.tokens[i] : (isNum(s.ts[i]) && t0 !== null ? s.ts[i] - t0 : null);
      if (!isNum(x)) continue;
      if (xs.length && x <= xs[xs.length - 1]) continue;
      var y = s[col][i];
      if (C.log && part === 'train' && !(isNum(y) && y > 0)) y = null;
      xs.push(x);
      ys.push(y);
    }
    return [xs, ys];
  }

  function compareTable(part, col) {
    var tables = C.picked.map(function (id) { return comparePoints(id, part, col); });
    if (!tables.length) return [[]];
    return uPlot.join(tables);
  }

  function fmtX(v) {
    if (v == null) return '—';
    if (C.xmode === 'time') return fmtDuration(v);
    return C.xmode === 'tokens' ? fmtSI(v) : String(v);
  }

  function buildCompareChart(id, part, title, logScale, fmt) {
    var fig = $(id);
    Array.prototype.slice.call(fig.querySelectorAll('.uplot, .nodata')).forEach(function (el) { el.remove(); });
    var axisColor = cssVar('--axis'), gridColor = cssVar('--grid');
    var series = [{ label: CMP_XLABEL[C.xmode], value: function (u, v) { return fmtX(v); } }];
    C.picked.forEach(function (rid) {
      var r = runById(rid);
      var color = runColor(rid);
      series.push({ label: r ? runLabel(r) : rid, stroke: color, width: 2, spanGaps: true,
                    points: part === 'val' ? { show: true, size: 6, fill: color } : { show: false },
                    value: function (u, v) { return v == null ? '—' : fmt(v); } });
    });
    var chart = { fig: fig, part: part, plot: null };
    var opts = {
      width: chartWidth(fig),
      height: chartHeight(),
      series: series,
      axes: [
        { stroke: axisColor, grid: { stroke: gridColor, width: 1 }, ticks: { stroke: gridColor, width: 1 },
          values: function (u, splits) { return splits.map(function (v) { return v == null ? '' : fmtX(v); }); } },
        { stroke: axisColor, grid: { stroke: gridColor, width: 1 }, ticks: { stroke: gridColor, width: 1 },
          size: 64, values: function (u, splits) { return splits.map(function (v) { return v == null ? '' : fmtSig(v); }); } }
      ],
      scales: { x: { time: false, range: function (u, min, max) { return sharedRange(min, max); } },
                y: logScale ? { distr: 3 } : {} },
      legend: { live: true },
      cursor: { sync: { key: 'nsad-compare' }, drag: { x: true, y: false } },
      hooks: {
        setSelect: [function (u) {
          if (u.select.width <= 0) return;
          C.zoom = [u.posToVal(u.select.left, 'x'), u.posToVal(u.select.left + u.select.width, 'x')];
        }],
        setScale: [function (u, key) {
          if (key !== 'x' || C.syncing || !C.charts) return;
          /* the other chart follows: validation and training share the x range */
          C.syncing = true;
          [C.charts.loss, C.charts.val].forEach(function (c) {
            if (c && c.plot !== u) c.plot.setScale('x', { min: u.scales.x.min, max: u.scales.x.max });
          });
          C.syncing = false;
        }]
      }
    };
    chart.plot = new uPlot(opts, [[]].concat(C.picked.map(function () { return []; })), fig);
    chart.plot.over.addEventListener('dblclick', function () { C.zoom = null; drawCompare(); });
    fig.dataset.title = title;
    return chart;
  }

  /* Both charts' x range: the user's zoom, else everything either plots. */
  function sharedRange(min, max) {
    if (C.zoom) return C.zoom.slice();
    var lo = null, hi = null;
    [['train', 'loss'], ['val', 'bpb']].forEach(function (pc) {
      C.picked.forEach(function (id) {
        var xs = comparePoints(id, pc[0], pc[1])[0];
        if (!xs.length) return;
        if (lo === null || xs[0] < lo) lo = xs[0];
        if (hi === null || xs[xs.length - 1] > hi) hi = xs[xs.length - 1];
      });
    });
    if (lo === null) return [min == null ? 0 : min, max == null ? 1 : max];
    if (hi === lo) hi = lo + 1;
    return [lo, hi];
  }

  function destroyCompare() {
    if (!C.charts) return;
    [C.charts.loss, C.charts.val].forEach(function (c) { c.plot.destroy(); });
    C.charts = null;
  }

  function rebuildCompare() {
    destroyCompare();
    C.builtKey = pickedKey();
    $('compare').hidden = C.picked.length === 0;
    $('compare-hint').hidden = C.picked.length > 0;
    if (!C.picked.length) return;
    C.charts = {
      loss: buildCompareChart('cmp-loss', 'train', 'Training loss', C.log, function (v) { return fmtFixed(v, 4); }),
      val: buildCompareChart('cmp-val', 'val', 'Validation bits/byte', false, function (v) { return fmtFixed(v, 4); })
    };
    drawCompare();
  }

  function drawCompare() {
    if (!C.charts) return;
    var loss = compareTable('train', 'loss'), val = compareTable('val', 'bpb');
    C.charts.loss.plot.setData(loss, true);
    C.charts.val.plot.setData(val, true);
    /* both on the same range, whichever data each holds */
    var range = sharedRange(null, null);
    C.syncing = true;
    C.charts.loss.plot.setScale('x', { min: range[0], max: range[1] });
    C.charts.val.plot.setScale('x', { min: range[0], max: range[1] });
    C.syncing = false;
    C.charts.loss.fig.dataset.points = String(loss[0].length);
    C.charts.val.fig.dataset.points = String(val[0].length);
  }

  function resizeCompare() {
    if (!C.charts) return;
    var h = chartHeight();
    [C.charts.loss, C.charts.val].forEach(function (c) { c.plot.setSize({ width: chartWidth(c.fig), height: h }); });
  }

  function csvCell(v) {
    var s = v == null ? '' : String(v);
    return /[",\n\r]/.test(s) ? '"' + s.replace(/"/g, '""') + '"' : s;
  }

  /* What the two charts plot, one row a point: run id, its name, the
   * series, x on the current axis, the value. */
  function compareCsv() {
    var rows = [['run', 'name', 'series', CMP_XLABEL[C.xmode], 'value'].join(',')];
    [['train', 'loss', 'train_loss'], ['val', 'bpb', 'val_bits_per_byte']].forEach(function (pc) {
      C.picked.forEach(function (id) {
        var r = runById(id);
        var pts = comparePoints(id, pc[0], pc[1]);
        for (var i = 0; i < pts[0].length; i++) {
          if (pts[1][i] == null) continue;
          rows.push([csvCell(id), csvCell(r ? r.name : ''), pc[2], pts[0][i], pts[1][i]].join(','));
        }
      });
    });
    return rows.join('\n') + '\n';
  }

  function downloadCsv() {
    var blob = new Blob([compareCsv()], { type: 'text/csv' });
    var a = document.createElement('a');
    a.href = URL.createObjectURL(blob);
    a.download = 'nsad-compare-' + C.xmode + '.csv';
    document.body.appendChild(a);
    a.click();
    a.remove();
    setTimeout(function () { URL.revokeObjectURL(a.href); }, 1000);
  }

  function wireCompare() {
    Array.prototype.forEach.call(document.querySelectorAll('input[name="cmp-xmode"]'), function (r) {
      r.checked = r.value === C.xmode;
      r.addEventListener('change', function () {
        if (!r.checked) return;
        C.xmode = r.value;
        C.zoom = null;
        localStorage.setItem(CMP_XMODE_KEY, C.xmode);
        rebuildCompare();
      });
    });
    var log = $('cmp-log');
    log.checked = C.log;
    log.addEventListener('change', function () {
      C.log = log.checked;
      localStorage.setItem(CMP_LOG_KEY, C.log ? '1' : '0');
      rebuildCompare();
    });
    $('cmp-csv').addEventListener('click', downloadCsv);
  }

  /* For the browser test: what the comparison shows. */
  function compareSnapshot() {
    function chartState(c) {
      if (!c) return null;
      return { min: c.plot.scales.x.min, max: c.plot.scales.x.max, labels: c.plot.series.slice(1).map(function (s) { return s.label; }),
               points: c.plot.data[0].length, distr: c.plot.scales.y.distr };
    }
    return { picked: C.picked.slice(), xmode: C.xmode, log: C.log,
             loss: chartState(C.charts && C.charts.loss), val: chartState(C.charts && C.charts.val), csv: compareCsv() };
  }

  /* Data parallelism: a row per rank of this node (step time, the gradient
   * reductions and the share the backward hid, the weights' all-gather);
   * hidden for a run of one rank. */
  function renderRanks(st) {
    var table = $('ranks');
    var ranks = Array.isArray(st.ranks) ? st.ranks : [];
    var show = isNum(st.world) && st.world > 1 && ranks.length > 0;
    table.hidden = !show;
    if (!show) return;
    setText('ranks-caption', 'Ranks: ' + st.world + (ranks.length < st.world ? ' (' + ranks.length + ' on this node)' : ''));
    var body = $('ranks-body');
    while (body.firstChild) body.removeChild(body.firstChild);
    ranks.forEach(function (r) {
      var tr = document.createElement('tr');
      var ms = function (v) { return isNum(v) ? (v * 1e3).toFixed(1) + ' ms' : '—'; };
      [String(r.rank), isNum(r.device) ? 'GPU ' + r.device : 'CPU', r.phase || '—', ms(r.step_s),
       ms(r.comm_s), isNum(r.overlap) ? Math.round(100 * r.overlap) + '%' : '—', ms(r.gather_s)]
        .forEach(function (text) {
          var td = document.createElement('td');
          td.textContent = text;
          tr.appendChild(td);
        });
      body.appendChild(tr);
    });
  }

  function setText(id, text) {
    var el = $(id);
    if (el.textContent !== text) el.textContent = text;
  }

  function renderStatus(st) {
    var state = String(st.state || 'idle');
    setText('run-id', st.id ? runLabel(st) : S.runId || '—');
    $('run-id').title = st.out_dir ? 'output: ' + st.out_dir : '';
    var badge = $('run-state');
    badge.dataset.state = state;
    setText('run-state', STATE_LABELS[state] || state);

    var step = isNum(st.step) ? st.step : 0;
    var total = isNum(st.total_steps) ? st.total_steps : 0;
    var pct = total > 0 ? Math.max(0, Math.min(100, 100 * step / total)) : 0;
    $('progress-fill').style.width = pct.toFixed(2) + '%';
    $('progress').setAttribute('aria-valuenow', pct.toFixed(1));
    setText('progress-text', 'step ' + step.toLocaleString() + ' / ' +
            (total ? total.toLocaleString() : '—') + (total ? '  (' + pct.toFixed(1) + '%)' : ''));

    setText('stat-loss', fmtFixed(st.loss, 4));
    setText('stat-val', fmtFixed(st.val_loss, 4));
    setText('stat-tps', fmtSI(st.toks_per_s));
    setText('stat-mfu', fmtPct(st.mfu));
    setText('stat-eta', ACTIVE_STATES[state] ? fmtDuration(st.eta_s) : '—');
    setText('stat-elapsed', fmtDuration(elapsedSeconds(st)));
    setText('stat-lr', fmtLr(st.lr));
    setText('stat-gn', fmtSig(st.grad_norm));
    setText('stat-mem', fmtBytes(st.mem_bytes));
    /* runs may train side by side on a node: say which GPUs this one holds */
    var gpus = Array.isArray(st.gpus) && st.gpus.length ? ':' + st.gpus.join(',') : '';
    setText('stat-device', st.device ? st.device + gpus + (st.precision ? ' · ' + st.precision : '') : '—');
    /* mem_bytes is device memory on a GPU and the process's RSS on the CPU */
    var memCaption = document.querySelector('#chart-mem figcaption');
    var memTitle = st.device === 'cpu' ? 'Host memory (CPU run)' : 'GPU memory';
    if (memCaption.textContent !== memTitle) memCaption.textContent = memTitle;
    var hb = $('stat-hb');
    hb.textContent = isNum(st.heartbeat_age_s)
      ? (st.heartbeat_age_s < 1 ? 'now' : fmtDuration(st.heartbeat_age_s) + ' ago') : '—';
    hb.title = st.phase ? 'phase: ' + st.phase + (isNum(st.phase_age_s) ? ' for ' + fmtDuration(st.phase_age_s) : '') : '';
    hb.classList.toggle('stale', !!ACTIVE_STATES[state] && isNum(st.heartbeat_age_s) &&
                        st.heartbeat_age_s > HEARTBEAT_STALE_S);

    renderRanks(st);

    var problems = [];
    if (st.anomaly) problems.push('Anomaly: ' + anomalyText(st.anomaly));
    if (st.error) problems.push('Error: ' + String(st.error));
    var an = $('anomaly');
    setText('anomaly', problems.join('  ·  '));
    an.hidden = problems.length === 0;

    $('halt-btn').disabled = S.busy || !HALTABLE_STATES[state];
    $('resume-btn').disabled = S.busy || !RESUMABLE_STATES[state];

    document.title = (STATE_LABELS[state] || state) + (total ? ' ' + pct.toFixed(0) + '%' : '') +
                     ' · ' + (st.id || '') + ' · nsad';
    renderConfig(st.config);
    noteSampleModel(st.config);
  }

  /* The API's anomaly code with words for a person; the code stays, since
   * it is what the run's .anomaly_type file and the logs say. */
  function anomalyText(code) {
    if (typeof code !== 'string') return JSON.stringify(code);
    var words = {
      nan_loss: 'the loss was NaN', inf_loss: 'the loss was infinite',
      nan_grad: 'a gradient was NaN', inf_grad: 'a gradient was infinite'
    };
    if (words[code]) return words[code] + ' (' + code + ')';
    var hang = /^hang:(.+)$/.exec(code);
    if (hang) return 'stuck in the ' + hang[1] + ' phase past its watchdog deadline (' + code + ')';
    return code;
  }

  /* Seconds the run has been going: to its end, or to now while active.
   * Uses the daemon's clock for both ends where it can. */
  function elapsedSeconds(st) {
    if (isNum(st.elapsed_s)) return st.elapsed_s;
    if (!isNum(st.started_at)) return null;
    if (isNum(st.ended_at)) return st.ended_at - st.started_at;
    if (!ACTIVE_STATES[st.state]) return null;
    return Date.now() / 1000 - serverClockSkew - st.started_at;
  }

  /* The API sends the resolved config as YAML text; an object (older
   * daemons, other tools) is drawn as one table per section. */
  function renderConfig(cfg) {
    var key = cfg == null ? '' : typeof cfg === 'string' ? cfg : JSON.stringify(cfg);
    if (key === S.configKey) return;
    S.configKey = key;
    var box = $('config');
    box.textContent = '';
    box.classList.toggle('config-text', typeof cfg === 'string');
    if (typeof cfg === 'string' && cfg) {
      var pre = document.createElement('pre');
      pre.textContent = cfg;
      box.appendChild(pre);
      return;
    }
    if (!cfg || typeof cfg !== 'object') {
      box.textContent = 'The daemon did not report a config for this run.';
      return;
    }
    var general = [];
    Object.keys(cfg).forEach(function (k) {
      var v = cfg[k];
      if (v && typeof v === 'object' && !Array.isArray(v)) box.appendChild(configTable(k, v));
      else general.push([k, v]);
    });
    if (general.length) {
      var obj = {};
      general.forEach(function (kv) { obj[kv[0]] = kv[1]; });
      box.insertBefore(configTable('run', obj), box.firstChild);
    }
  }

  function configTable(title, obj) {
    var table = document.createElement('table');
    var cap = document.createElement('caption');
    cap.textContent = title;
    table.appendChild(cap);
    Object.keys(obj).forEach(function (k) {
      var tr = document.createElement('tr');
      var th = document.createElement('th');
      th.scope = 'row';
      th.textContent = k;
      var td = document.createElement('td');
      var v = obj[k];
      td.textContent = v !== null && typeof v === 'object' ? JSON.stringify(v) : String(v);
      tr.appendChild(th);
      tr.appendChild(td);
      table.appendChild(tr);
    });
    return table;
  }

  function refreshStatus() {
    var gen = S.gen, id = S.runId;
    return api('GET', '/runs/' + encodeURIComponent(id)).then(function (st) {
      if (gen !== S.gen) return;
      var before = S.status && S.status.state;
      S.status = st;
      renderStatus(st);
      if (before && before !== st.state) S.eventsDue = true;
    });
  }

  /* Fetches every sample after the cursor (following pages when the API
   * sends a partial answer) and appends them to the store. */
  function refreshMetrics() {
    var gen = S.gen, id = S.runId, pages = 0, added = false;
    function page() {
      return api('GET', '/runs/' + encodeURIComponent(id) + '/metrics?since=' + S.cursor).then(function (m) {
        if (gen !== S.gen) return;
        var generation = isNum(m.generation) ? m.generation : 0;
        if (S.generation !== null && generation !== S.generation) {
          /* points already drawn were replaced (resume redid steps, NaN
           * rollback): start the series over */
          S.generation = generation;
          S.store = newStore();
          S.cursor = 0;
          added = true;
          return page();
        }
        S.generation = generation;
        $('charts-card').dataset.generation = String(generation);
        var train = Array.isArray(m.train) ? m.train : [];
        var val = Array.isArray(m.val) ? m.val : [];
        if (train.length) appendTrain(S.store, train, S.smoothing);
        if (val.length) appendVal(S.store, val);
        added = added || train.length > 0 || val.length > 0;
        var next = isNum(m.next) ? m.next : S.cursor;
        var moved = next !== S.cursor;
        S.cursor = next;
        pages++;
        var full = train.length >= METRICS_PAGE_ROWS || val.length >= METRICS_PAGE_ROWS;
        if (full && moved && pages < MAX_METRIC_PAGES) return page();
      });
    }
    return page().then(function () {
      if (gen === S.gen && added) refreshCharts();
    });
  }

  /* One event detail value, short: file paths by their last component
   * (the full detail is in the row's tooltip), fractions to 4 digits. */
  function detailValue(v) {
    if (v !== null && typeof v === 'object') return JSON.stringify(v);
    if (typeof v === 'number') return Number.isInteger(v) ? String(v) : fmtSig(v);
    var text = String(v);
    if (/^\/[^\s]*\/[^\s/]+\/?$/.test(text)) text = '…/' + text.replace(/\/$/, '').split('/').pop();
    return text;
  }

  function eventDetailText(detail) {
    if (detail == null) return '';
    if (typeof detail !== 'object') return detailValue(detail);
    return Object.keys(detail).map(function (k) { return k + '=' + detailValue(detail[k]); }).join('  ');
  }

  function eventItem(ev) {
    var li = document.createElement('li');
    var time = document.createElement('time');
    if (isNum(ev.ts)) time.dateTime = new Date(ev.ts * 1000).toISOString();
    time.textContent = fmtClock(ev.ts);
    var type = document.createElement('span');
    type.className = 'ev-type';
    type.dataset.type = String(ev.type || '');
    type.textContent = String(ev.type || 'event').replace(/_/g, ' ');
    var detail = document.createElement('span');
    detail.className = 'ev-detail';
    var shownDetail = ev.detail;
    if (shownDetail && typeof shownDetail === 'object' && shownDetail.step === ev.step) {
      /* the trainer repeats the step in the detail; it is already shown */
      shownDetail = Object.assign({}, shownDetail);
      delete shownDetail.step;
    }
    if (ev.type === 'samples' && shownDetail && Array.isArray(shownDetail.samples)) {
      /* the texts are in the Samples card */
      shownDetail = { samples: shownDetail.samples.length };
    }
    var text = eventDetailText(shownDetail);
    detail.textContent = (isNum(ev.step) ? 'step ' + ev.step + (text ? '  ' : '') : '') + text;
    if (ev.detail && typeof ev.detail === 'object' && Object.keys(ev.detail).length) li.title = JSON.stringify(ev.detail);
    li.appendChild(time);
    li.appendChild(type);
    li.appendChild(detail);
    return li;
  }

  /* Fetches the events after the last one seen and puts them on top of the
   * list (newest first). */
  function refreshEvents() {
    var gen = S.gen, id = S.runId;
    S.eventsDue = false;
    return api('GET', '/runs/' + encodeURIComponent(id) + '/events?since=' + S.eventsNext).then(function (data) {
      if (gen !== S.gen) return;
      var events = Array.isArray(data.events) ? data.events : [];
      var lastSeq = S.events.length ? S.events[S.events.length - 1].seq : -Infinity;
      var fresh = events.filter(function (ev) { return ev && !(isNum(ev.seq) && ev.seq <= lastSeq); });
      if (isNum(data.next)) S.eventsNext = data.next;
      if (!fresh.length) return;
      var list = $('events');
      fresh.forEach(function (ev) {
        S.events.push(ev);
        list.insertBefore(eventItem(ev), list.firstChild);
        if (ev.type === 'samples') renderSamples(ev);
      });
      while (list.children.length > MAX_EVENTS_SHOWN) list.removeChild(list.lastChild);
      if (S.events.length > MAX_EVENTS_SHOWN) S.events.splice(0, S.events.length - MAX_EVENTS_SHOWN);
      $('events-empty').hidden = true;
    });
  }

  /* ---- samples ------------------------------------------------------------------ */

  /* The latest `samples` event: each fixed prompt (dimmed) and what the
   * model made of it at that evaluation. */
  function renderSamples(ev) {
    var d = ev.detail || {};
    if (!Array.isArray(d.samples)) return;
    var list = $('samples');
    list.textContent = '';
    d.samples.forEach(function (x) {
      var li = document.createElement('li');
      var prompt = document.createElement('span');
      prompt.className = 'sample-prompt';
      prompt.textContent = String(x.prompt || '');
      var text = document.createElement('span');
      text.className = 'sample-text';
      text.textContent = String(x.text || '');
      li.appendChild(prompt);
      li.appendChild(text);
      list.appendChild(li);
    });
    $('samples-step').textContent = isNum(d.step) ? 'at step ' + d.step : '';
    $('samples-empty').hidden = d.samples.length > 0;
  }

  function resetSamples() {
    $('samples').textContent = '';
    $('samples-step').textContent = '';
    $('samples-empty').hidden = false;
    if (S.sampleAbort) S.sampleAbort.abort();
    S.sampleAbort = null;
    $('sample-out').hidden = true;
    $('sample-out').textContent = '';
    sampleNote('');
    $('sample-btn').disabled = false;
    $('sample-ids').removeAttribute('aria-invalid');
    S.sampleModel = sampleModelOf(null);
    S.sampleModelKey = '';
    renderSampleMode();
  }

  /* What the shown run's config says about prompting its model: `text`
   * true when its data.tokenizer is one nsad encodes text with, false when
   * it is another (a run on token shards: it takes and gives token ids
   * only, proto/api.md POST /sample), null when the config does not say;
   * `vocab` bounds its token ids. */
  function sampleModelOf(cfg) {
    var tok = configValue(cfg, 'data', 'tokenizer');
    var vocab = configValue(cfg, 'model', 'vocab_size');
    var named = typeof tok === 'string' && tok !== '';
    return {
      text: named ? Object.prototype.hasOwnProperty.call(TEXT_TOKENIZERS, tok) : null,
      tokenizer: named ? tok : null,
      vocab: isNum(vocab) && vocab >= 1 ? vocab : null
    };
  }

  /* One key of a run's config: from the resolved YAML text the API sends
   * ("section:" lines, "  key: value" under them, strings in double
   * quotes) or from an object (older daemons, other tools); null when the
   * config does not have it. */
  function configValue(cfg, section, key) {
    if (cfg && typeof cfg === 'object') {
      var sec = cfg[section];
      return sec && typeof sec === 'object' && sec[key] !== undefined ? sec[key] : null;
    }
    if (typeof cfg !== 'string') return null;
    var inSection = false, value = null;
    cfg.split('\n').some(function (line) {
      if (/^[^\s#]/.test(line)) {
        inSection = new RegExp('^' + section + ':\\s*(#.*)?$').test(line);
        return false;
      }
      var kv = inSection ? /^\s+([A-Za-z_][\w-]*):\s*(.*)$/.exec(line) : null;
      if (!kv || kv[1] !== key) return false;
      value = yamlScalar(kv[2]);
      return true;
    });
    return value;
  }

  function yamlScalar(text) {
    var quoted = /^"((?:[^"\\]|\\.)*)"/.exec(text);
    if (quoted) return quoted[1].replace(/\\(.)/g, '$1');
    var plain = text.replace(/\s+#.*$/, '').trim();
    return /^-?\d+(\.\d+)?([eE][-+]?\d+)?$/.test(plain) ? Number(plain) : plain;
  }

  /* Called with each status: redraws the box when what the config says
   * about the model changes (a run switch, the first status of a run). */
  function noteSampleModel(cfg) {
    var m = sampleModelOf(cfg);
    var key = JSON.stringify(m);
    if (key === S.sampleModelKey) return;
    S.sampleModelKey = key;
    S.sampleModel = m;
    renderSampleMode();
  }

  /* What the box sends: token ids for a model with no text form, else the
   * user's pick. */
  function sampleMode() {
    return S.sampleModel.text === false ? 'ids' : S.sampleMode;
  }

  /* The mode's field shows (the other is disabled too, so that the form
   * does not require it); Text cannot be picked for a model with no text
   * form, and a line says why and what ids it takes. */
  function renderSampleMode() {
    var m = S.sampleModel, ids = sampleMode() === 'ids';
    Array.prototype.forEach.call(document.querySelectorAll('input[name="sample-mode"]'), function (r) {
      r.checked = r.value === (ids ? 'ids' : 'text');
      if (r.value === 'text') r.disabled = m.text === false;
    });
    $('sample-prompt').hidden = ids;
    $('sample-prompt').disabled = ids;
    $('sample-ids').hidden = !ids;
    $('sample-ids').disabled = !ids;
    $('sample-label').htmlFor = ids ? 'sample-ids' : 'sample-prompt';
    var range = m.vocab ? ' from 0 to ' + (m.vocab - 1) : '';
    var hint = !ids ? ''
      : m.text === false
        ? 'This model has no text form (its tokenizer, ' + m.tokenizer + ', is not one nsad runs): it is prompted ' +
          'with token ids' + range + ', commas or spaces between, and answers with token ids.'
        : 'Token ids' + range + ', commas or spaces between; the answer comes as token ids.';
    setText('sample-hint', hint);
    $('sample-hint').hidden = !hint;
  }

  /* The ids field's text as token ids: whole numbers, commas or spaces
   * between, within the model's vocabulary when the config gives it (the
   * daemon checks them again). Returns { ids } or { error }. */
  function parseIds(text, vocab) {
    var words = text.split(/[\s,]+/).filter(function (w) { return w !== ''; });
    if (!words.length) return { error: 'none given; enter whole numbers such as 3, 14, 15 (commas or spaces between)' };
    if (words.length > MAX_PROMPT_IDS) return { error: words.length + ' ids; a prompt holds at most ' + MAX_PROMPT_IDS };
    var top = vocab ? vocab - 1 : MAX_TOKEN_ID;
    var ids = [];
    for (var i = 0; i < words.length; i++) {
      var w = words[i];
      var at = ' (position ' + (i + 1) + ')';
      if (!/^\d+$/.test(w)) {
        return { error: '"' + (w.length > 20 ? w.slice(0, 20) + '…' : w) + '"' + at +
                        ' is not a whole number; enter ids such as 3, 14, 15 (commas or spaces between)' };
      }
      var id = Number(w);
      if (id > top) {
        return { error: w + at + (vocab ? ' is not in the model\'s vocabulary of ' + vocab + ' ids'
                                        : ' is above the largest token id') + '; allowed: 0 to ' + top };
      }
      ids.push(id);
    }
    return { ids: ids };
  }

  function sampleNote(text, bad) {
    var note = $('sample-note');
    note.textContent = text;
    note.hidden = !text;
    note.classList.toggle('bad', !!bad);
  }

  /* Empties the output box into one part per continuation - its heading
   * when there are several, the prompt, then what is generated - and
   * returns them: { head, text (a text node to append to) }. */
  function sampleParts(out, n, prompt, ids) {
    out.textContent = '';
    var parts = [];
    for (var i = 0; i < n; i++) {
      var head = null;
      if (n > 1) {
        if (i) out.appendChild(document.createTextNode(ids ? '\n' : '\n\n'));
        head = document.createElement('span');
        head.className = 'sample-head';
        head.textContent = sampleHead(i, null);
        out.appendChild(head);
        out.appendChild(document.createTextNode('\n'));
      }
      var p = document.createElement('span');
      /* ids all look alike: the prompt's are dimmed, as in the Samples list */
      if (ids) p.className = 'sample-prompt';
      p.textContent = prompt;
      var text = document.createTextNode('');
      out.appendChild(p);
      out.appendChild(text);
      parts.push({ head: head, text: text });
    }
    return parts;
  }

  /* A continuation's heading, as nsactl sample --n prints it. */
  function sampleHead(i, s) {
    return '--- sample ' + i + (s ? ' (' + s.tokens + ' tokens, ' + s.stop + ')' : '') + ' ---';
  }

  /* The done event's words; with several continuations their headings
   * take each one's tokens and stop. */
  function sampleSummary(msg, parts) {
    var rate = fmtFixed(msg.tokens_per_s, 1) + ' tokens/s';
    if (parts.length === 1) return msg.tokens + ' tokens, ' + msg.stop + ', ' + rate;
    (Array.isArray(msg.samples) ? msg.samples : []).forEach(function (s, i) {
      if (parts[i] && s) parts[i].head.textContent = sampleHead(i, s);
    });
    return parts.length + ' samples, ' + msg.tokens + ' tokens, ' + rate;
  }

  /* POST /sample for the shown run - a text prompt, or token ids checked
   * here first - and appends the text or the ids as its JSON lines arrive
   * (proto/api.md); the note says how it ended. */
  function generateSample() {
    var id = S.runId;
    if (!id || S.sampleAbort) return;
    var out = $('sample-out'), btn = $('sample-btn');
    var ids = sampleMode() === 'ids';
    var body = { run: id }, prompt;
    if (ids) {
      var field = $('sample-ids');
      var parsed = parseIds(field.value, S.sampleModel.vocab);
      if (parsed.error) {
        out.hidden = true;
        sampleNote('Token ids: ' + parsed.error, true);
        field.setAttribute('aria-invalid', 'true');
        field.focus();
        return;
      }
      field.removeAttribute('aria-invalid');
      body.prompt_ids = parsed.ids;
      prompt = parsed.ids.join(' ');
    } else {
      prompt = $('sample-prompt').value;
      if (!prompt) return;
      body.prompt = prompt;
    }
    var n = parseInt($('sample-n').value, 10);
    var tokens = parseInt($('sample-tokens').value, 10);
    var temp = parseFloat($('sample-temp').value);
    if (isNum(n) && n > 1) body.n = n;
    if (isNum(tokens)) body.max_tokens = tokens;
    if (isNum(temp)) body.temperature = temp;
    var parts = sampleParts(out, body.n || 1, prompt, ids);
    out.hidden = false;
    sampleNote('');
    btn.disabled = true;
    var note = $('sample-note');
    var ctrl = window.AbortController ? new AbortController() : null;
    S.sampleAbort = ctrl || { abort: function () {} };
    var headers = { 'Accept': 'application/x-ndjson', 'Content-Type': 'application/json' };
    var token = getToken();
    if (token) headers['Authorization'] = 'Bearer ' + token;
    function finish(text) {
      if (S.sampleAbort !== (ctrl || S.sampleAbort)) return;
      S.sampleAbort = null;
      btn.disabled = false;
      sampleNote(text);
    }
    /* the last event's words, shown when the response has ended (not when
     * the event arrives): the box reads "finished" only once the request is */
    var ending = null;
    function onLine(line) {
      var msg;
      try { msg = JSON.parse(line); } catch (e) { return; }
      var part = parts[isNum(msg.sample) ? msg.sample : 0];
      if (typeof msg.text === 'string') { if (part) part.text.appendData(msg.text); }
      else if (Array.isArray(msg.ids)) { if (part) part.text.appendData(msg.ids.map(function (x) { return ' ' + x; }).join('')); }
      else if (msg.event === 'done') ending = sampleSummary(msg, parts);
      else if (msg.event === 'error') ending = 'error: ' + msg.message;
      else if (msg.event === 'start') note.textContent = 'step ' + msg.step + ' on ' + msg.device;
    }
    fetch(API + '/sample', { method: 'POST', headers: headers, body: JSON.stringify(body), cache: 'no-store',
                             credentials: 'same-origin', signal: ctrl ? ctrl.signal : undefined }).then(function (res) {
      if (!res.ok || !res.body) {
        return res.text().then(function (text) {
          var err = null;
          try { err = JSON.parse(text).error; } catch (e) { err = null; }
          finish('error: ' + (err && err.message ? err.message : 'HTTP ' + res.status));
        });
      }
      var reader = res.body.getReader(), decoder = new TextDecoder(), pending = '';
      function pump() {
        return reader.read().then(function (r) {
          if (r.done) {
            if (pending) onLine(pending);
            if (S.sampleAbort) finish(ending || 'the stream ended early');
            return;
          }
          pending += decoder.decode(r.value, { stream: true });
          var lines = pending.split('\n');
          pending = lines.pop();
          lines.forEach(function (l) { if (l) onLine(l); });
          return pump();
        });
      }
      return pump();
    }).catch(function (e) {
      if (e && e.name === 'AbortError') return;
      finish('error: ' + (e && e.message ? e.message : String(e)));
    });
  }

  /* ---- polling ---------------------------------------------------------------- */

  function pollSoon() {
    if (S.timer) clearTimeout(S.timer);
    S.timer = setTimeout(poll, 0);
  }

  function nextDelay() {
    if (document.hidden) return POLL_HIDDEN_MS;
    if (S.status && !ACTIVE_STATES[S.status.state]) return POLL_IDLE_MS;
    return POLL_ACTIVE_MS;
  }

  var polling = false;

  function poll() {
    S.timer = null;
    if (polling || S.needToken) return;
    polling = true;
    var now = Date.now();
    var chain = Promise.resolve();
    if (!S.runId || now - S.runsAt >= RUNS_EVERY_MS) {
      S.runsAt = now;
      chain = chain.then(refreshRuns);
    }
    chain = chain.then(function () {
      return refreshCompare().then(drawCompare);
    });
    chain = chain.then(function () {
      if (!S.runId) return;
      return refreshStatus().then(refreshMetrics).then(function () {
        if (S.eventsDue || Date.now() - S.eventsAt >= EVENTS_EVERY_MS) {
          S.eventsAt = Date.now();
          return refreshEvents();
        }
      });
    });
    chain.then(function () {
      setConn(true, 'live');
      showError('');
    }, handleFailure).then(function () {
      polling = false;
      if (!S.needToken && !S.timer) S.timer = setTimeout(poll, nextDelay());
    });
  }

  function handleFailure(e) {
    if (!(e instanceof ApiError)) {
      /* a bug in this page, not an API answer: say so rather than hide it */
      setConn(false, 'error');
      showError('Dashboard error: ' + (e && e.message ? e.message : String(e)));
      if (window.console) console.error(e);  /* keeps the stack; polling goes on */
      return;
    }
    if (e.status === 401) { askForToken(); return; }
    if (e.status === 404 && S.runId) {
      /* the run is gone (state dir wiped, daemon restarted fresh) */
      S.runId = null;
      resetRunView();
      showRunSections(false);
      destroyCharts();
    }
    setConn(false, e.status === 0 ? 'offline' : 'error');
    showError(e.message + (e.code && e.status ? ' (' + e.code + ')' : ''));
  }

  function askForToken() {
    var had = !!getToken();
    S.needToken = true;
    if (had) sessionStorage.removeItem(TOKEN_KEY);
    setConn(false, 'token needed');
    showError('');
    var note = $('token-note');
    note.hidden = !had;
    note.textContent = had ? 'The daemon rejected the token this tab had; paste the current one.' : '';
    $('token-card').hidden = false;
    $('token-input').focus();
  }

  /* ---- controls ---------------------------------------------------------------- */

  function runAction(action) {
    var id = S.runId;
    if (!id || S.busy) return;
    S.busy = true;
    $('halt-btn').disabled = true;
    $('resume-btn').disabled = true;
    showError('', 'action');
    api('POST', '/runs/' + encodeURIComponent(id) + '/' + action, {}).then(function () {
      S.eventsDue = true;
    }, function (e) {
      if (e instanceof ApiError && e.status === 401) { askForToken(); return; }
      showError((action === 'halt' ? 'Halt' : 'Resume') + ' failed: ' + (e && e.message ? e.message : String(e)), 'action');
    }).then(function () {
      S.busy = false;
      if (S.status) renderStatus(S.status);
      pollSoon();
    });
  }

  function applyTheme() {
    var pref = localStorage.getItem(THEME_KEY) || 'auto';
    if (pref === 'light' || pref === 'dark') document.documentElement.dataset.theme = pref;
    else delete document.documentElement.dataset.theme;
    var btn = $('theme-btn');
    var label = 'Colour theme: ' + pref + ' (click to change)';
    btn.title = label;
    btn.setAttribute('aria-label', label);
    btn.textContent = pref === 'light' ? '☀' : pref === 'dark' ? '☾' : '◐';
  }

  function cycleTheme() {
    var order = ['auto', 'light', 'dark'];
    var cur = localStorage.getItem(THEME_KEY) || 'auto';
    localStorage.setItem(THEME_KEY, order[(order.indexOf(cur) + 1) % order.length]);
    applyTheme();
    rebuildCharts();  /* the canvas does not follow CSS: redraw with the new palette */
    rebuildCompare();
    renderRunsTable();
  }

  function wireControls() {
    $('halt-btn').addEventListener('click', function () { runAction('halt'); });
    $('resume-btn').addEventListener('click', function () { runAction('resume'); });
    $('run-select').addEventListener('change', function (e) {
      S.pinned = true;
      selectRun(e.target.value, true);
    });
    $('theme-btn').addEventListener('click', cycleTheme);
    $('sample-form').addEventListener('submit', function (e) {
      e.preventDefault();
      generateSample();
    });
    Array.prototype.forEach.call(document.querySelectorAll('input[name="sample-mode"]'), function (r) {
      r.addEventListener('change', function () {
        if (!r.checked) return;
        S.sampleMode = r.value === 'ids' ? 'ids' : 'text';
        renderSampleMode();
        $(S.sampleMode === 'ids' ? 'sample-ids' : 'sample-prompt').focus();
      });
    });

    var smooth = $('smooth');
    smooth.value = String(S.smoothing);
    $('smooth-val').textContent = S.smoothing.toFixed(2);
    smooth.addEventListener('input', function () {
      var w = parseFloat(smooth.value);
      if (!isNum(w)) return;
      S.smoothing = Math.max(0, Math.min(0.99, w));
      $('smooth-val').textContent = S.smoothing.toFixed(2);
      localStorage.setItem(SMOOTH_KEY, String(S.smoothing));
      recomputeEma(S.store, S.smoothing);
      refreshCharts();
    });

    Array.prototype.forEach.call(document.querySelectorAll('input[name="xmode"]'), function (r) {
      r.checked = r.value === S.xmode;
      r.addEventListener('change', function () {
        if (!r.checked) return;
        S.xmode = r.value === 'time' ? 'time' : 'step';
        localStorage.setItem(XMODE_KEY, S.xmode);
        rebuildCharts();
      });
    });

    $('token-form').addEventListener('submit', function (e) {
      e.preventDefault();
      var value = $('token-input').value.trim();
      if (!value) return;
      sessionStorage.setItem(TOKEN_KEY, value);
      $('token-input').value = '';
      $('token-card').hidden = true;
      S.needToken = false;
      setConn(false, 'connecting…');
      pollSoon();
    });

    if (window.matchMedia) {
      var mq = window.matchMedia('(prefers-color-scheme: dark)');
      var onScheme = function () {
        if (document.documentElement.dataset.theme) return;
        rebuildCharts();
        rebuildCompare();
        renderRunsTable();
      };
      if (mq.addEventListener) mq.addEventListener('change', onScheme);
    }

    if (window.ResizeObserver) {
      var pending = false;
      new ResizeObserver(function () {
        if (pending) return;
        pending = true;
        requestAnimationFrame(function () { pending = false; resizeCharts(); });
      }).observe($('charts-card'));
      var cmpPending = false;
      new ResizeObserver(function () {
        if (cmpPending) return;
        cmpPending = true;
        requestAnimationFrame(function () { cmpPending = false; resizeCompare(); });
      }).observe($('runs-card'));
    } else {
      window.addEventListener('resize', function () { resizeCharts(); resizeCompare(); });
    }

    document.addEventListener('visibilitychange', function () { if (!document.hidden) pollSoon(); });
  }

  /* A read-only view of what the charts hold, for the browser test and for
   * a person at the console: copies, so nothing outside can change the page. */
  function snapshot() {
    var t = S.store.train, v = S.store.val;
    return {
      runId: S.runId,
      generation: S.generation,
      cursor: S.cursor,
      train: { step: t.step.slice(), ts: t.ts.slice(), loss: t.loss.slice(), ema: t.ema.slice() },
      val: { step: v.step.slice(), val_loss: v.val_loss.slice() }
    };
  }

  function start() {
    window.nsadDashboard = Object.freeze({ snapshot: snapshot, compare: compareSnapshot });
    adoptTokenFromHash();
    applyTheme();
    if (typeof uPlot !== 'function') {
      showError('The chart library (vendor/uPlot.iife.min.js) did not load; the page cannot draw charts.');
      return;
    }
    wireControls();
    wireCompare();
    pollSoon();
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', start);
  else start();
})();
