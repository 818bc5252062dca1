// agentroll view: the page. Plain script, no library, nothing fetched but this server's /api (or, in a page
// written with -o, nothing at all: the data is inlined). Every text from the data goes in as text, never markup.
// It names no stage: headings, labels and figures come from the folder's system, through the data.
// The script is this file, view-tokens.js and view-group.js, in that order, inside one function (page.py),
// so that their names are the page's own; each file is a part of that function's body.
  const PAGE = 100;
  const dataNode = document.getElementById("agentroll-data");
  const INLINE = dataNode ? JSON.parse(dataNode.textContent) : null;
  const state = {
    status: null, rows: [], byN: new Map(), moved: 0, generation: 0, page: 0, filter: {}, hits: null,
    hitsFor: null, group: null, opened: null, selected: [], mode: "lp", fresh: new Set(), base: 0, total: 0,
    window: Infinity,  // rows the page holds at once (the server says how many): a larger folder is paged by ranges
  };

  // -- helpers --------------------------------------------------------------------------------------------------
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (key === "text") node.textContent = value;
      else if (key === "class") node.className = value;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else if (key === "data") Object.assign(node.dataset, value);
      else node.setAttribute(key, value === true ? "" : value);
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }
  const $ = (query) => document.querySelector(query);
  function put(node, ...children) {
    node.replaceChildren(...children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false));
    return node;
  }
  function fmt(value, digits = 3) {
    if (value === null || value === undefined) return "-";
    if (typeof value !== "number") return String(value);
    if (Number.isInteger(value)) return value.toLocaleString("en-US");
    const text = value.toFixed(digits);
    return text.includes(".") ? text.replace(/0+$/, "").replace(/\.$/, "") : text;
  }
  function short(text, most) {
    const flat = String(text ?? "").replace(/\s+/g, " ").trim();
    return flat.length <= most ? flat : flat.slice(0, most - 1) + "…";
  }
  // one POSIX shell word, whatever the text holds (a path with a quote, a space, a $): a pasted command runs as shown
  function shellWord(text) { return `'${String(text).replace(/'/g, `'\\''`)}'`; }
  function groups(n) { return `${fmt(n)} group${n === 1 ? "" : "s"}`; }
  function json(value) { return typeof value === "string" ? value : JSON.stringify(value, null, 1); }
  function rewardColour(value) {
    if (typeof value !== "number") return "#ccc";
    const t = Math.max(0, Math.min(1, value));
    const mix = (a, b) => Math.round(a + (b - a) * t);
    return `rgb(${mix(213, 0)},${mix(94, 158)},${mix(0, 115)})`;
  }
  async function get(path) {
    const answer = await fetch(path, { cache: "no-store" });
    const body = await answer.json().catch(() => ({ error: `${answer.status} ${answer.statusText}` }));
    if (!answer.ok) throw Object.assign(new Error(body.error || answer.statusText), { body, status: answer.status });
    return body;
  }
  function copyButton(value, what) {
    const button = el("button", {
      class: "copy", text: "copy", title: `copy ${what}: ${value}`, data: { copy: value },
      onclick: (event) => {
        event.stopPropagation();
        const done = () => { button.classList.add("copied"); button.textContent = "copied"; };
        if (navigator.clipboard && window.isSecureContext) {
          navigator.clipboard.writeText(value).then(done, () => fallbackCopy(value) && done());
        } else if (fallbackCopy(value)) done();
      },
    });
    return button;
  }
  function fallbackCopy(value) {
    const area = el("textarea", { style: "position:fixed;opacity:0" });
    area.value = value;
    document.body.append(area);
    area.select();
    let ok = false;
    try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
    area.remove();
    return ok;
  }

  // -- where the data comes from ----------------------------------------------------------------------------------
  // a page written with -o holds each group gzip-compressed in base64, unpacked when it is first opened or searched
  const unpacked = new Map();
  async function inlineGroup(n) {
    const key = String(n);
    if (!unpacked.has(key)) {
      const packed = INLINE.groups[key];
      if (packed === undefined) {
        const s = INLINE.sample;
        const held = s ? `this page holds ${groups(s.n)} of the folder's ${fmt(s.of)} (--sample ${s.n})` : "this page does not hold it";
        throw new Error(`Group ${n} is not in this page: ${held}. To see every group, serve the folder: agentroll view ${shellWord(INLINE.status.folder)}`);
      }
      const bytes = Uint8Array.from(atob(packed), (c) => c.charCodeAt(0));
      const text = await new Response(new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"))).text();
      const { pieces, group } = JSON.parse(text);
      const byId = (node) => {  // static.py's _by_id undone: each token list's pieces from the table, and those apart
        if (Array.isArray(node)) { node.forEach(byId); return; }
        if (!node || typeof node !== "object") return;
        for (const value of Object.values(node)) byId(value);
        if (Array.isArray(node.tx)) {
          node.t = node.id.map((token) => pieces[token]);
          for (const [i, piece] of node.tx) node.t[i] = piece;
          delete node.tx;
        }
      };
      byId(group);
      unpacked.set(key, group);
    }
    return unpacked.get(key);
  }
  const api = INLINE ? {
    status: async () => INLINE.status,
    rows: async () => ({ generation: 0, rows: INLINE.rows, groups: INLINE.rows.length, moved: [], moved_count: 0 }),
    group: inlineGroup,
    search: async (q) => ({ groups: await inlineSearch(q) }),
    raw: null,
  } : {
    status: () => get("api/status"),
    rows: (start, moved) => get(`api/rows?start=${start}&moved=${moved}`),
    group: (n) => get(`api/group?n=${n}`),
    search: (q) => get(`api/search?q=${encodeURIComponent(q)}`),
    raw: (n, at) => get(`api/raw?n=${n}&at=${at}`),
  };
  const RECORD_TEXT = ["rollout_id", "response", "content", "reward_info", "tool_calls"];
  async function inlineSearch(query) {
    const needle = query.toLowerCase();
    const found = [];
    for (const n of Object.keys(INLINE.groups)) {
      const g = await inlineGroup(n);
      const texts = [g.id, g.label, g.problem, g.metadata];
      for (const e of g.executions || []) for (const r of e.records) for (const k of RECORD_TEXT) texts.push(r[k]);
      if (texts.some((t) => t !== null && t !== undefined && json(t).toLowerCase().includes(needle))) found.push(+n);
    }
    return found;
  }

  // -- the filter, in the address (a link shows the same list and group) -----------------------------------------
  const FILTER_KEYS = ["q", "rmin", "rmax", "spread", "stage", "trunc", "fail", "tag", "mkey", "mval", "policy", "audit",
    "sort", "page", "g", "r", "from"];
  function readHash() {
    const params = new URLSearchParams(location.hash.slice(1));
    const f = {};
    for (const key of FILTER_KEYS) f[key] = params.get(key) || "";
    return f;
  }
  function writeHash(f) {
    const params = new URLSearchParams();
    for (const key of FILTER_KEYS) if (f[key]) params.set(key, f[key]);
    const hash = "#" + params.toString();
    if (location.hash !== hash) history.replaceState(null, "", hash);
  }
  function matches(r, f) {
    if (state.hits && !state.hits.has(r.n)) return false;
    // the reward filters hold for one group: the row's, or in a head-to-head folder one policy's (never pooled)
    if ((f.rmin !== "" || f.rmax !== "" || f.spread) && !groupsOf(r).some((g) => rewardMatches(g, f))) return false;
    if (f.stage) {
      const s = r.stages[f.stage];
      if (!s) return false;
      if (f.trunc && !(s[1] > 0)) return false;
    } else if (f.trunc && !(r.truncated > 0)) return false;
    if (f.fail && !(r.checks > 0)) return false;
    if (f.tag && !(r.tags[f.tag] > 0)) return false;
    if (f.mkey) {
      if (!(f.mkey in r.meta)) return false;
      if (f.mval !== "" && String(r.meta[f.mkey]) !== f.mval) return false;
    }
    if (f.policy && !(r.policies || []).includes(f.policy)) return false;
    if (f.audit && !(r.audit && r.audit[1] > 0)) return false;
    return true;
  }
  function groupsOf(r) {
    return r.by_policy ? Object.values(r.by_policy) : [r];
  }
  function rewardMatches(g, f) {
    if (f.rmin !== "" && !(g.mean >= +f.rmin)) return false;
    if (f.rmax !== "" && !(g.mean <= +f.rmax)) return false;
    if (f.spread === "mixed" && !(g.std > 0)) return false;
    if (f.spread === "uniform" && g.std !== 0) return false;
    return true;
  }
  function sortKey(r, key) {
    if ((key === "mean" || key === "std") && r.by_policy) return Math.max(...groupsOf(r).map((g) => g[key] ?? -Infinity));
    if (key.startsWith("fig:")) return r.figures[key.slice(4)] ?? -Infinity;
    if (key.startsWith("pol:")) return r.by_policy?.[key.slice(4)]?.mean ?? -Infinity;
    if (key === "teacher") return r.teacher ? r.teacher.mean : -Infinity;
    return r[key] ?? -Infinity;
  }
  function shown() {
    const f = state.filter;
    const rows = state.rows.filter((r) => matches(r, f));
    if (f.sort) {
      const key = f.sort.replace(/^-/, "");
      const sign = f.sort.startsWith("-") ? -1 : 1;
      rows.sort((a, b) => sign * (sortKey(a, key) - sortKey(b, key)) || a.n - b.n);
    }
    return rows;
  }

  // -- the header and the filter bar ------------------------------------------------------------------------------
  function renderHeader() {
    const s = state.status;
    const system = s.system;
    const head = $("header");
    put(head, 
      el("h1", { text: `agentroll view: ${s.folder}` }),
      el("div", { class: "sub" },
        `${system.name} system: ${system.stages.join(" → ") || "(stages as recorded)"} · `,
        el("b", { id: "count", text: groups(state.total) }),
        ` · ${fmt(INLINE ? state.rows.reduce((a, r) => a + r.records, 0) : s.records)} records · ${s.shards.length} shards `,
        INLINE ? el("span", { class: "done", text: INLINE.sample ? `${INLINE.sample.n} of ${INLINE.sample.of} groups, drawn at random`
          : "a page written once" })
          : el("span", { class: s.live ? "live" : "done", id: "live",
            text: s.ended ? "the run ended without completing" : !s.live ? "complete" : s.final ? "reading the folder"
              : "following the run (not complete yet)" }),
      ),
      system.warning ? el("div", { class: "warn", text: system.warning }) : null,
      s.error ? el("div", { class: "error", text: s.error }) : null,
      s.ended ? el("div", { class: "warn", id: "ended", text: s.ended }) : null,
      s.tokenizer.error ? el("div", { class: "warn", id: "no-tokenizer",
        text: `Tokens are shown as ids: ${s.tokenizer.error}. The response text is beside them; pass --tokenizer to read them.` }) : null,
      s.audit ? el("div", { class: "note", text: `Audit ${s.audit.file} (model ${s.audit.model}): ${s.audit.named} records named, ` +
        `${s.audit.ok ? "all within tolerance" : "some out of tolerance"}. Only those records and their worst token are known.` }) : null,
    );
  }
  function option(value, text, current) { return el("option", { value, selected: value === current, text }); }
  function renderFilters() {
    const f = state.filter;
    const system = state.status.system;
    const stages = [...new Set([...system.stages, ...state.rows.flatMap((r) => Object.keys(r.stages))])];
    const tags = [...new Set([...system.tags, ...state.rows.flatMap((r) => Object.keys(r.tags))])];
    const metaKeys = [...new Set(state.rows.flatMap((r) => Object.keys(r.meta)))].sort();
    const values = f.mkey ? [...new Set(state.rows.filter((r) => f.mkey in r.meta).map((r) => String(r.meta[f.mkey])))].sort().slice(0, 200) : [];
    const policies = [...new Set(state.rows.flatMap((r) => r.policies || []).filter((p) => p !== null))];
    const figures = system.figures;
    const set = (key) => (event) => {
      const target = event.target;
      state.filter[key] = target.type === "checkbox" ? (target.checked ? "1" : "") : target.value;
      state.filter.page = "";
      if (key === "q") return search();
      if (key === "mkey") { state.filter.mval = ""; renderFilters(); }  // its values' list follows the field
      refresh();
    };
    const sorts = [["", "folder order"], ["-mean", "reward mean, high first"], ["mean", "reward mean, low first"],
      ["-std", "reward spread"], ["-truncated", "most truncated"], ["-checks", "most check findings"],
      ["-longest", "longest response"], ["-tokens", "most tokens"],
      ...figures.flatMap((x) => [[`fig:${x.key}`, `${x.label}, low first`], [`-fig:${x.key}`, `${x.label}, high first`]]),
      ...policies.flatMap((p) => [[`pol:${p}`, `${p}'s reward mean, low first`], [`-pol:${p}`, `${p}'s reward mean, high first`]]),
      ...(state.rows.some((r) => r.teacher) ? [["-teacher", "|student − teacher|"]] : [])];
    put($("#filters"), 
      el("label", {}, "search ", el("input", { type: "search", id: "f-q", value: f.q, placeholder: "text of responses, answers, rewards…", oninput: debounce(set("q"), 300) })),
      el("label", {}, "reward mean ", el("input", { type: "number", id: "f-rmin", step: "any", value: f.rmin, placeholder: "min", onchange: set("rmin") }),
        " – ", el("input", { type: "number", id: "f-rmax", step: "any", value: f.rmax, placeholder: "max", onchange: set("rmax") })),
      el("label", {}, "group ", el("select", { id: "f-spread", onchange: set("spread") }, option("", "any", f.spread),
        option("mixed", "mixed rewards (learns)", f.spread), option("uniform", "uniform rewards (no signal)", f.spread))),
      el("label", {}, "stage ", el("select", { id: "f-stage", onchange: set("stage") }, option("", "any", f.stage), stages.map((s) => option(s, s, f.stage)))),
      el("label", {}, el("input", { type: "checkbox", id: "f-trunc", checked: !!f.trunc, onchange: set("trunc") }), " truncated"),
      el("label", {}, el("input", { type: "checkbox", id: "f-fail", checked: !!f.fail, onchange: set("fail") }), " failing a system check"),
      tags.length ? el("label", {}, "label ", el("select", { id: "f-tag", onchange: set("tag") }, option("", "any", f.tag), tags.map((t) => option(t, t, f.tag)))) : null,
      metaKeys.length ? el("label", {}, "metadata ", el("select", { id: "f-mkey", onchange: set("mkey") }, option("", "-", f.mkey), metaKeys.map((k) => option(k, k, f.mkey))),
        f.mkey ? el("select", { id: "f-mval", onchange: set("mval") }, option("", "any value", f.mval), values.map((v) => option(v, v, f.mval))) : null) : null,
      policies.length ? el("label", {}, "policy ", el("select", { id: "f-policy", onchange: set("policy") }, option("", "any", f.policy), policies.map((p) => option(p, p, f.policy)))) : null,
      state.status.audit ? el("label", {}, el("input", { type: "checkbox", id: "f-audit", checked: !!f.audit, onchange: set("audit") }), " out of the audit's tolerance") : null,
      el("label", {}, "sort ", el("select", { id: "f-sort", onchange: set("sort") }, sorts.map(([v, t]) => option(v, t, f.sort)))),
      state.total > state.window ? el("label", {}, "groups ", el("select", { id: "f-from", onchange: (e) => moveWindow(+e.target.value) },
        Array.from({ length: Math.ceil(state.total / state.window) }, (_, i) => i * state.window).map((b) =>
          option(String(b), `${fmt(b + 1)} to ${fmt(Math.min(b + state.window, state.total))}`, String(state.base))))) : null,
      el("label", {}, "colour tokens by ", el("select", { id: "f-mode", onchange: (e) => { state.mode = e.target.value; renderRecords(); } },
        option("lp", "logprob", state.mode),
        state.rows.some((r) => r.teacher) ? option("teacher", "|student − teacher|", state.mode) : null,
        state.status.audit ? option("audit", "|recorded − audited| (worst token)", state.mode) : null,
        option("none", "nothing", state.mode))),
    );
  }
  function debounce(fn, ms) { let t; return (e) => { clearTimeout(t); t = setTimeout(() => fn(e), ms); }; }
  async function search() {
    const q = state.filter.q.trim();
    if (!q) { state.hits = null; state.hitsFor = null; state.hitsMore = false; return refresh(); }
    $("#pager").textContent = `searching for “${q}”…`;
    try {
      const answer = await api.search(q);
      if (state.filter.q.trim() !== q) return;
      state.hits = new Set(answer.groups || []);
      state.hitsFor = q;
      state.hitsMore = !!answer.more;
    } catch (err) { showError(err); }
    refresh();
  }

  // -- the list -----------------------------------------------------------------------------------------------------
  function finals(r) {
    const out = [];
    let last;
    r.finals.forEach((v, i) => {
      const policy = r.policies ? r.policies[i] : undefined;
      if (policy !== undefined && policy !== last) out.push(el("span", { class: "pol", text: policy ?? "-" }));
      last = policy;
      out.push(el("span", { class: "final", style: `background:${rewardColour(v)}`, title: `execution ${i}: final reward ${fmt(v)}` }));
    });
    return out;
  }
  function renderList() {
    const f = state.filter;
    const rows = shown();
    const pages = Math.max(1, Math.ceil(rows.length / PAGE));
    const page = Math.min(+f.page || 0, pages - 1);
    const figures = state.status.system.figures;
    const meta = [...new Set(state.rows.flatMap((r) => Object.keys(r.meta)))].sort().slice(0, 2);
    const policies = [...new Set(state.rows.flatMap((r) => Object.keys(r.by_policy || {})))];
    const head = el("tr", {}, el("th", { class: "num", text: "#" }), el("th", { text: "problem" }),
      figures.map((x) => el("th", { class: "num", text: x.label, title: `the system's figure ${x.key}, over this group's executions` })),
      el("th", { text: "executions (final reward)" }), el("th", { class: "num", text: "mean" }),
      policies.map((p) => el("th", { class: "num", text: `mean · ${p}`, title: `the reward mean of policy ${p}'s executions` })),
      el("th", { class: "num", text: "solved" }),
      el("th", { class: "num", text: "truncated" }), el("th", { class: "num", text: "findings" }), el("th", { text: "labels" }),
      meta.map((k) => el("th", { text: k })), el("th", { text: "where" }));
    const body = rows.slice(page * PAGE, (page + 1) * PAGE).map((r) => el("tr", {
      data: { n: r.n }, class: [r.n === state.opened ? "open" : "", state.fresh.has(r.n) ? "new" : ""].join(" ").trim() || null,
      onclick: () => openGroup(r.n),
    },
      el("td", { class: "num", text: r.n }), el("td", { text: short(r.id, 28), title: r.id }),
      figures.map((x) => el("td", { class: "num", text: fmt(r.figures[x.key]) })),
      el("td", {}, finals(r)), el("td", { class: "num", text: fmt(r.mean) }),
      policies.map((p) => el("td", { class: "num", text: fmt(r.by_policy?.[p]?.mean) })),
      el("td", { class: "num", text: r.pass[0] ? `${r.pass[1]}/${r.pass[0]}` : "-", title: "executions solved (final reward 1) / executions, over the group" }),
      el("td", { class: "num" + (r.truncated ? " trunc" : ""), text: fmt(r.truncated) }),
      el("td", { class: "num" + (r.checks ? " fail" : ""), text: fmt(r.checks), title: r.check || "" }),
      el("td", {}, Object.entries(r.tags).map(([t, n]) => el("span", { class: "tag", text: n > 1 ? `${t} ×${n}` : t }))),
      meta.map((k) => el("td", { text: short(r.meta[k] ?? "", 24) })),
      el("td", { class: "mono", text: `${state.status.shards[r.shard] ?? "?"}:${r.line}${r.live ? " (being written)" : ""}` })));
    put($("#list"), rows.length ? el("table", {}, el("thead", {}, head), el("tbody", {}, body))
      : el("div", { class: "empty-list", text: state.rows.length ? "No group matches the filter." : "No group yet." }));
    const more = (delta) => el("button", { text: delta < 0 ? "← previous" : "next →", onclick: () => { state.filter.page = String(page + delta); refresh(); } });
    const outside = state.hits ? state.hits.size - state.rows.filter((r) => state.hits.has(r.n)).length : 0;
    put($("#pager"), `showing ${fmt(rows.length)} of ${groups(state.rows.length)}`,
      state.total > state.rows.length ? ` (${fmt(state.base + 1)} to ${fmt(state.base + state.rows.length)} of ${fmt(state.total)})` : "",
      state.hitsFor ? ` matching “${state.hitsFor}”` : "",
      state.hitsMore ? el("b", { text: ` (the first ${fmt(state.hits.size)} found: more match, narrow the search)` }) : null,
      outside > 0 ? ` (${fmt(outside)} more in other ranges of groups)` : "", pages > 1 ? ` · page ${page + 1} of ${pages} ` : "",
      page > 0 ? more(-1) : null, page + 1 < pages ? more(1) : null);
    $("#count").textContent = groups(state.total);
  }
  function refresh() {  // the filter bar is drawn when its choices change, never under the user's typing
    writeHash(state.filter);
    renderList();
  }
