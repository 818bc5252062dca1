// agentroll view: the page. Plain script, no library, nothing fetched but this server's /api (or, in a page
// written with -o, nothing at all: the data is inlined). Every text from the data goes in as text, never markup.
// It names no stage: headings, labels and figures come from the folder's system, through the data.
"use strict";
(() => {
  const PAGE = 100;
  const dataNode = document.getElementById("agentroll-data");
  const INLINE = dataNode ? JSON.parse(dataNode.textContent) : null;
  const state = {
    status: null, rows: [], byN: new Map(), moved: 0, generation: 0, page: 0, filter: {}, hits: null,
    hitsFor: null, group: null, opened: null, selected: [], mode: "lp", fresh: new Set(), seen: 0,
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
  const api = INLINE ? {
    status: async () => INLINE.status,
    rows: async () => ({ generation: 0, rows: INLINE.rows, groups: INLINE.rows.length, moved: [], moved_count: 0 }),
    group: async (n) => INLINE.groups[String(n)],
    search: async (q) => ({ groups: inlineSearch(q) }),
    raw: null,
  } : {
    status: () => get("api/status"),
    rows: (start, moved) => get(`api/rows?start=${start}&moved=${moved}`),
    group: (n) => get(`api/group?n=${n}`),
    search: (q) => get(`api/search?q=${encodeURIComponent(q)}`),
    raw: (n, at) => get(`api/raw?n=${n}&at=${at}`),
  };
  const RECORD_TEXT = ["rollout_id", "response", "content", "reward_info", "tool_calls"];
  function inlineSearch(query) {
    const needle = query.toLowerCase();
    const found = [];
    for (const [n, g] of Object.entries(INLINE.groups)) {
      const texts = [g.id, g.label, g.problem, g.metadata];
      for (const e of g.executions || []) for (const r of e.records) for (const k of RECORD_TEXT) texts.push(r[k]);
      if (texts.some((t) => t !== null && t !== undefined && json(t).toLowerCase().includes(needle))) found.push(+n);
    }
    return found;
  }

  // -- the filter, in the address (a link shows the same list and group) -----------------------------------------
  const FILTER_KEYS = ["q", "rmin", "rmax", "spread", "stage", "trunc", "fail", "tag", "mkey", "mval", "policy", "audit",
    "sort", "page", "g", "r"];
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
    if (f.rmin !== "" && !(r.mean >= +f.rmin)) return false;
    if (f.rmax !== "" && !(r.mean <= +f.rmax)) return false;
    if (f.spread === "mixed" && !(r.std > 0)) return false;
    if (f.spread === "uniform" && r.std !== 0) return false;
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
  function sortKey(r, key) {
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
        el("b", { id: "count", text: groups(state.rows.length) }),
        ` · ${fmt(state.rows.reduce((a, r) => a + r.records, 0))} records · ${s.shards.length} shards `,
        INLINE ? el("span", { class: "done", text: INLINE.sample ? `${INLINE.sample.n} of ${INLINE.sample.of} groups, drawn at random`
          : "a page written once" })
          : el("span", { class: s.live ? "live" : "done", id: "live",
            text: !s.live ? "complete" : s.final ? "reading the folder" : "following the run (not complete yet)" }),
      ),
      system.warning ? el("div", { class: "warn", text: system.warning }) : null,
      s.error ? el("div", { class: "error", text: s.error }) : null,
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
      el("td", { class: "num", text: r.pass[0] ? `${r.pass[1]}/${r.pass[0]}` : "-", title: "answers right / answers, over the group" }),
      el("td", { class: "num" + (r.truncated ? " trunc" : ""), text: fmt(r.truncated) }),
      el("td", { class: "num" + (r.checks ? " fail" : ""), text: fmt(r.checks), title: r.check || "" }),
      el("td", {}, Object.entries(r.tags).map(([t, n]) => el("span", { class: "tag", text: n > 1 ? `${t} ×${n}` : t }))),
      meta.map((k) => el("td", { text: short(r.meta[k] ?? "", 24) })),
      el("td", { class: "mono", text: `${state.status.shards[r.shard] ?? "?"}:${r.line}${r.live ? " (being written)" : ""}` })));
    put($("#list"), rows.length ? el("table", {}, el("thead", {}, head), el("tbody", {}, body))
      : el("div", { class: "empty-list", text: state.rows.length ? "No group matches the filter." : "No group yet." }));
    const more = (delta) => el("button", { text: delta < 0 ? "← previous" : "next →", onclick: () => { state.filter.page = String(page + delta); refresh(); } });
    put($("#pager"), `showing ${fmt(rows.length)} of ${groups(state.rows.length)}`,
      state.hitsFor ? ` matching “${state.hitsFor}”` : "",
      state.hitsMore ? el("b", { text: ` (the first ${fmt(state.hits.size)} found: more match, narrow the search)` }) : null, pages > 1 ? ` · page ${page + 1} of ${pages} ` : "",
      page > 0 ? more(-1) : null, page + 1 < pages ? more(1) : null);
    $("#count").textContent = groups(state.rows.length);
  }
  function refresh() {  // the filter bar is drawn when its choices change, never under the user's typing
    writeHash(state.filter);
    renderList();
  }

  // -- a group --------------------------------------------------------------------------------------------------------
  async function openGroup(n, keep) {
    state.opened = n;
    state.filter.g = String(n);
    if (!keep) { state.selected = []; state.filter.r = ""; }
    writeHash(state.filter);
    document.querySelectorAll("#list tr.open").forEach((tr) => tr.classList.remove("open"));
    const tr = document.querySelector(`#list tr[data-n="${n}"]`);
    if (tr) tr.classList.add("open");
    put($("main"), el("p", { class: "note", text: `reading group ${n}…` }));
    let group;
    try { group = await api.group(n); } catch (err) { return showError(err, $("main")); }
    if (state.opened !== n) return;
    state.group = group;
    renderGroup();
  }
  function row(n) { return state.byN.get(n); }
  function renderGroup() {
    const g = state.group;
    const r = row(g.n) || { figures: {}, tags: {}, pass: [0, 0] };
    const main = $("main");
    if (g.broken) {
      return put(main, el("h2", { text: `problem ${g.id}` }),
        el("div", { class: "error", text: `Its records are not of the schema: ${g.broken}` }), el("pre", { text: json(g.records) }));
    }
    const where = `${g.where.file}:${g.where.line}`;
    const figures = state.status.system.figures.map((x) => el("span", {}, `${x.label} `, el("b", { text: fmt(r.figures[x.key]) })));
    put(main, 
      el("h2", {}, `problem ${g.id}`, copyButton(g.id, "the problem id"), " ",
        el("span", { class: "sub mono", text: where }), copyButton(where, "its file and first line")),
      el("div", { class: "facts" },
        el("span", {}, "label ", el("b", { class: "mono", text: short(json(g.label), 80) })),
        r.by_policy ? el("span", {}, "reward mean by policy ", Object.entries(r.by_policy).map(([p, x]) => el("b", { text: `${p} ${fmt(x.mean)} ` })))
          : el("span", {}, "group reward mean ", el("b", { text: fmt(g.group_reward_mean) }), ` (std ${fmt(g.group_reward_std)})`),
        r.pass[0] ? el("span", {}, "answers right ", el("b", { text: `${r.pass[1]} of ${r.pass[0]}` })) : null,
        el("span", {}, `${g.executions.length} executions, ${g.executions.reduce((a, e) => a + e.records.length, 0)} records`)),
      el("div", { class: "figs" }, figures),
      Object.keys(r.tags).length ? el("div", {}, Object.entries(r.tags).map(([t, n]) => el("span", { class: "tag", text: `${t} ×${n}` }))) : null,
      g.metadata && Object.keys(g.metadata).length ? el("div", { class: "facts" },
        Object.entries(g.metadata).map(([k, v]) => el("span", {}, `${k} `, el("b", { text: short(json(v), 60) })))) : null,
      el("details", {}, el("summary", { text: "the problem as given" }), el("pre", { text: json(g.problem) })),
      executionsView(g),
      el("div", { id: "records" }),
    );
    const wanted = (state.filter.r || "").split(",").filter(Boolean);
    state.selected = wanted.map((w) => w.split(".").map(Number)).filter(([k, at]) => g.executions[k] && g.executions[k].records[at]);
    if (!state.selected.length) {
      const k = g.executions.findIndex((e) => e.records.length);
      if (k >= 0) state.selected = [[k, 0]];
    }
    renderRecords();
  }
  function executionsView(g) {
    const policies = [...new Set(g.executions.map((e) => e.policy))];
    const column = (e, k) => executionView(g, e, k);
    if (policies.length === 1 && policies[0] === null) {
      return el("div", { class: "executions" }, g.executions.map(column));
    }
    return el("div", { class: "policies executions" }, policies.map((p) => {
      const members = g.executions.map((e, k) => [e, k]).filter(([e]) => e.policy === p);
      const mean = members.reduce((a, [e]) => a + e.final_reward, 0) / members.length;
      const own = (row(g.n)?.by_policy || {})[p];
      return el("div", { class: "policy", data: { policy: p ?? "" } },
        el("h3", {}, `policy ${p ?? "(none)"}`, el("span", { class: "sub", text: ` · mean final reward ${fmt(mean)} over ${members.length}` })),
        own ? el("div", { class: "figs" }, state.status.system.figures.map((x) => el("span", {}, `${x.label} `, el("b", { text: fmt(own.figures[x.key]) }))),
          own.pass[0] ? el("span", {}, "answers right ", el("b", { text: `${own.pass[1]} of ${own.pass[0]}` })) : null) : null,
        el("div", { class: "executions" }, members.map(([e, k]) => column(e, k))));
    }));
  }
  function executionView(g, e, k) {
    return el("div", { class: "execution", data: { k } },
      el("div", { class: "head" },
        el("b", { text: `execution ${e.index}` }), " · final reward ",
        el("b", { text: fmt(e.final_reward), style: `color:${rewardColour(e.final_reward)}` }),
        e.policy !== null ? el("span", { class: "badge", text: ` · ${e.policy}` }) : null,
        el("div", { class: "badge mono" }, `rollout ${short(e.rollout_id, 14)}`, copyButton(e.rollout_id, "the rollout id")),
        e.tags.map((t) => el("span", { class: "tag", text: t }))),
      e.stages.map((s) => el("div", { class: "stage", data: { stage: s.stage } },
        el("h4", { class: s.records.length ? null : "none", text: s.heading }),
        s.records.map((at) => card(e, k, at)))));
  }
  function card(e, k, at) {
    const rec = e.records[at];
    const right = rec.raw_reward === 1 ? "right" : rec.raw_reward === 0 ? "wrong" : "";
    const selected = state.selected.some(([a, b]) => a === k && b === at);
    const calls = rec.tool_calls || [];
    return el("div", {
      class: ["card", right, rec.continues !== null && rec.continues !== undefined ? "turn" : "", selected ? "selected" : ""].join(" "),
      data: { k, at }, title: "click: show its tokens below; shift-click: beside the others",
      onclick: (event) => select(k, at, event.shiftKey || event.ctrlKey || event.metaKey),
    },
      el("div", {}, el("span", { class: "label", text: rec.label }), rec.mark ? el("span", { class: "mark", text: ` ${rec.mark}` }) : null),
      el("div", { class: "badge" },
        el("span", { class: rec.status === "truncated" ? "trunc" : "", text: rec.status }),
        ` · raw ${fmt(rec.raw_reward)} / reward ${fmt(rec.reward)} · ${rec.tokens.id.length} tokens`,
        rec.finish_reason && rec.finish_reason !== "stop" ? ` · ${rec.finish_reason}` : "",
        rec.trainable === false ? " · frozen" : "", rec.policy ? ` · ${rec.policy}` : "",
        rec.audit ? el("span", { class: rec.audit.failed ? "fail" : "", text: ` · audit max |Δ| ${fmt(rec.audit.max_abs)}` }) : null),
      rec.answer !== null ? el("div", { class: "excerpt" }, "answer ", el("b", { class: "mono", text: rec.answer })) :
        el("div", { class: "excerpt", text: rec.content !== null ? short(rec.content, 160) : "no answer content" }),
      calls.map((c) => el("div", { class: "call", text: `→ ${c.name ?? "?"}(${short(json(c.arguments), 60)}) ${c.status}: ${short(c.result ?? c.error ?? "", 70)}` })),
      rec.findings.map((m) => el("div", { class: "finding", text: m })));
  }
  function select(k, at, add) {
    const key = (s) => `${s[0]}.${s[1]}`;
    if (add) {
      if (!state.selected.some((s) => s[0] === k && s[1] === at)) state.selected = [...state.selected, [k, at]].slice(-3);
    } else state.selected = [[k, at]];
    state.filter.r = state.selected.map(key).join(",");
    writeHash(state.filter);
    document.querySelectorAll(".card.selected").forEach((c) => c.classList.remove("selected"));
    for (const [a, b] of state.selected) {
      const c = document.querySelector(`.card[data-k="${a}"][data-at="${b}"]`);
      if (c) c.classList.add("selected");
    }
    renderRecords();
  }

  // -- a record, token by token ---------------------------------------------------------------------------------------
  function lpClass(lp) {
    if (typeof lp !== "number") return "";
    const p = Math.exp(lp);
    return p >= 0.9 ? "" : p >= 0.5 ? "lp1" : p >= 0.1 ? "lp2" : p >= 0.01 ? "lp3" : "lp4";
  }
  function gapClass(d) { return !(d >= 0.1) ? "" : d < 0.5 ? "d1" : d < 1 ? "d2" : d < 2 ? "d3" : "d4"; }
  function piece(pieces, ids, i) {
    if (!pieces) return `⟨${ids[i]}⟩`;
    return pieces[i] === "" ? "▫" : pieces[i].replace(/\n/g, "↵\n");
  }
  function span(text, cls, i) {
    const node = document.createElement("span");
    node.className = cls;
    node.dataset.i = i;
    node.textContent = text;
    return node;
  }
  function tokensBox(kind, tip, fill) {
    const box = el("div", { class: "tokens", data: { kind } });
    const frag = document.createDocumentFragment();
    fill(frag);
    box.append(frag);
    box.tip = tip;
    return box;
  }
  function responseClass(g, rec, i) {
    const t = rec.tokens;
    const cls = ["tok"];
    if (t.m && t.m[i] === 0) cls.push("masked");
    else if (state.mode === "lp") cls.push(lpClass(t.lp[i]));
    else if (state.mode === "teacher" && t.tl) cls.push(gapClass(Math.abs(t.lp[i] - t.tl[i])));
    if (state.mode === "audit" && rec.audit && rec.audit.worst_token && rec.audit.worst_token.position === i) cls.push("worst");
    if (!t.t) cls.push("idonly"); else if (t.t[i] === "") cls.push("empty");
    if (g.special.includes(t.id[i])) cls.push("special");
    return cls.filter(Boolean).join(" ");
  }
  function responseTokens(g, rec, from = 0) {
    const t = rec.tokens;
    return (frag) => { for (let i = from; i < t.id.length; i++) frag.append(span(piece(t.t, t.id, i), responseClass(g, rec, i), i)); };
  }
  function promptTokens(g, rec, from, to) {
    const p = g.prompts[rec.prompt.key];
    const hm = rec.prompt.hm, hl = rec.prompt.hl;
    return (frag) => {
      for (let i = from; i < to; i++) {
        let cls = "tok prompt";
        if (hm) cls = hm[i] ? `tok history ${state.mode === "lp" ? lpClass(hl[i]) : ""}` : "tok injected";
        if (g.special.includes(p.id[i])) cls += " special";
        frag.append(span(piece(p.t, p.id, i), cls.trim(), i));
      }
    };
  }
  function alternatives(g, top, i) {
    if (!top || !Array.isArray(top[0][i])) return null;
    return top[0][i].map((id, j) => `${JSON.stringify(g.vocab[id] ?? `⟨${id}⟩`)} ${fmt(top[1][i][j], 3)}`).join(" · ");
  }
  function responseTip(g, rec, i) {
    const t = rec.tokens;
    const lines = [`response token ${i}: id ${t.id[i]} ${t.t ? JSON.stringify(t.t[i]) : ""}`];
    lines.push(`logprob ${t.lp[i]} (p ${fmt(Math.exp(t.lp[i]), 4)})` + (t.rank ? ` · rank ${t.rank[i] ?? "-"}` : ""));
    lines.push(t.m && t.m[i] === 0 ? "outside the loss mask (0): not trained on" : "loss mask 1");
    if (t.tl) lines.push(`teacher logprob ${t.tl[i]} · |student − teacher| ${fmt(Math.abs(t.lp[i] - t.tl[i]), 4)}`);
    const top = alternatives(g, t.top, i);
    if (top) lines.push(`top: ${top}`);
    const ttop = alternatives(g, t.ttop, i);
    if (ttop) lines.push(`teacher top: ${ttop}`);
    const w = rec.audit && rec.audit.worst_token;
    if (w && w.position === i) lines.push(`audit: recorded ${w.recorded}, recomputed ${w.recomputed} (|Δ| ${fmt(Math.abs(w.delta), 4)}): the record's worst`);
    return lines.join("\n");
  }
  function promptTip(g, rec, i) {
    const p = g.prompts[rec.prompt.key];
    const hm = rec.prompt.hm;
    const lines = [`prompt token ${i}: id ${p.id[i]} ${p.t ? JSON.stringify(p.t[i]) : ""}`];
    if (!hm) lines.push("the first turn's prompt: not trained on");
    else if (hm[i]) lines.push(`sampled by the model in an earlier turn (history_mask 1), logprob ${rec.prompt.hl[i]}`);
    else lines.push("injected (history_mask 0): the template, the system, a tool's result; not trained on");
    return lines.join("\n");
  }
  function legend(rec) {
    const item = (cls, text) => el("span", {}, el("span", { class: `tok ${cls}`, text: " ab " }), text, "  ");
    const scale = state.mode === "teacher"
      ? [item("", "|Δ| < 0.1"), item("d1", "< 0.5"), item("d2", "< 1"), item("d3", "< 2"), item("d4", "≥ 2")]
      : state.mode === "lp" ? [item("", "p ≥ 0.9"), item("lp1", "≥ 0.5"), item("lp2", "≥ 0.1"), item("lp3", "≥ 0.01"), item("lp4", "< 0.01")]
        : state.mode === "audit" ? [item("worst", "the audit's worst token of this record")] : [];
    return el("div", { class: "legend" }, scale, item("masked", "outside the loss mask"), item("injected", "injected (history 0)"),
      rec.tokens.t ? null : el("b", { text: "no tokenizer: ids shown" }));
  }
  function callsTable(calls) {
    return el("table", { class: "calls" }, el("tr", {}, ["#", "tool", "arguments", "status", "seconds", "result / error"].map((h) => el("th", { text: h }))),
      calls.map((c, i) => el("tr", { class: c.status === "ok" ? "" : "fail" },
        el("td", { text: i, title: c.id ? `id ${c.id}` : "" }), el("td", { class: "mono", text: c.name ?? "(unreadable)" }),
        el("td", {}, el("pre", { text: json(c.arguments) })), el("td", { text: c.status }), el("td", { text: fmt(c.duration_s) }),
        el("td", {}, el("pre", { text: c.error ? `error: ${c.error}\n${c.result ?? ""}` : c.result ?? "" })))));
  }
  function recordView(g, k, at) {
    const e = g.executions[k];
    const rec = e.records[at];
    const where = `${g.where.file}:${rec.line}`;
    const command = g.where.zstd ? `zstdcat '${g.where.path}' | sed -n '${rec.line}p'` : `sed -n '${rec.line}p' '${g.where.path}'`;
    const prev = rec.continues !== null && rec.continues !== undefined ? e.records[rec.continues] : null;
    const n = rec.prompt.n;
    const head = prev ? Math.min(n, prev.prompt.n + prev.tokens.id.length) : 0;
    const facts = [["status", rec.status], ["finish_reason", rec.finish_reason], ["stop_reason", rec.stop_reason],
      ["raw_reward / reward", `${fmt(rec.raw_reward)} / ${fmt(rec.reward)}`], ["reward_info", rec.reward_info],
      ["judgment", rec.judgment], ["listed_as", rec.listed_as], ["turn", prev ? `${rec.turn}, continues record ${rec.continues}` : rec.turn],
      ["trainable", rec.trainable], ["policy", rec.policy], ["model", rec.model], ["endpoint", rec.endpoint],
      ["latency_s / attempts", `${fmt(rec.latency_s)} / ${rec.attempts}`], ["sampling", rec.sampling && JSON.stringify(rec.sampling)],
      ["weight_versions", rec.weight_versions && JSON.stringify(rec.weight_versions)],
      ["tokens", `${n} prompt + ${rec.tokens.id.length} response`],
      ["teacher |Δ|", rec.tokens.gap && `mean ${fmt(rec.tokens.gap.mean, 4)}, max ${fmt(rec.tokens.gap.max, 4)}`],
      ["audit", rec.audit && `max |Δ| ${fmt(rec.audit.max_abs, 4)}, mean ${fmt(rec.audit.mean_abs, 4)} over ${rec.audit.tokens} tokens` +
        (rec.audit.fails && rec.audit.fails.length ? `: ${rec.audit.fails.join("; ")}` : "")]]
      .filter(([, v]) => v !== undefined && v !== null && v !== "");
    const raw = el("div", {});
    const whole = el("details", { ontoggle: (ev) => {
      if (!ev.target.open || ev.target.dataset.drawn) return;
      ev.target.dataset.drawn = "1";
      ev.target.append(tokensBox("whole", (i) => i < n ? promptTip(g, rec, i) : responseTip(g, rec, i - n), (frag) => {
        promptTokens(g, rec, 0, n)(frag);
        const f2 = document.createDocumentFragment();
        responseTokens(g, rec)(f2);
        for (const s of f2.childNodes) s.dataset.i = String(n + +s.dataset.i);
        frag.append(f2);
      }));
    } }, el("summary", { text: "the whole sequence as a trainer takes it (history_mask + loss_mask)" }));
    return el("div", { class: "record", data: { k, at } },
      el("div", { class: "bar" }, el("h3", {}, rec.label, rec.mark ? el("span", { class: "mark", text: ` ${rec.mark}` }) : null,
        el("span", { class: "sub", text: ` · execution ${e.index} · record ${at} (${rec.stage} ${rec.worker})` }))),
      el("div", { class: "facts mono" }, el("span", {}, where, copyButton(where, "its file and line")),
        el("span", {}, `rollout ${rec.rollout_id}`, copyButton(rec.rollout_id, "the rollout id")),
        el("span", {}, "command", copyButton(command, "a command that prints the record")),
        api.raw ? el("button", { text: "raw JSON", onclick: async () => {
          try { const a = await api.raw(g.n, at + g.executions.slice(0, k).reduce((x, y) => x + y.records.length, 0));
            put(raw, el("div", { class: "note", text: `${a.file} line ${a.line}` }), el("pre", { text: JSON.stringify(a.record, null, 1) })); }
          catch (err) { showError(err, raw); }
        } }) : null),
      raw,
      rec.findings.map((m) => el("div", { class: "finding", text: `the system's check: ${m}` })),
      el("table", { class: "kv" }, facts.map(([k2, v]) => el("tr", {}, el("td", { text: k2 }), el("td", { text: String(v) })))),
      prev ? [
        el("details", {}, el("summary", { text: `the earlier turns: ${head} tokens (record ${rec.continues}'s prompt and response)` }),
          tokensBox("history", (i) => promptTip(g, rec, i), promptTokens(g, rec, 0, head))),
        el("div", { class: "note", text: `then injected before this turn: ${n - head} tokens` }),
        tokensBox("injected", (i) => promptTip(g, rec, i), promptTokens(g, rec, head, n)),
      ] : el("details", {}, el("summary", { text: `the prompt: ${n} tokens` }), tokensBox("prompt", (i) => promptTip(g, rec, i), promptTokens(g, rec, 0, n))),
      el("div", { class: "note", text: `the response: ${rec.tokens.id.length} tokens` }),
      legend(rec),
      tokensBox("response", (i) => responseTip(g, rec, i), responseTokens(g, rec)),
      whole,
      rec.tool_calls && rec.tool_calls.length ? [el("h3", { text: `tool calls (${rec.tool_calls.length})` }), callsTable(rec.tool_calls)] : null,
      el("details", {}, el("summary", { text: "the response text, and its answer content" }), el("pre", { text: rec.response ?? "" }),
        el("pre", { text: rec.content ?? "(no answer content)" })));
  }
  function renderRecords() {
    const host = $("#records");
    if (!host || !state.group || state.group.broken) return;
    put(host, ...state.selected.map(([k, at]) => recordView(state.group, k, at)));
  }

  // -- the tooltip, errors, following the run, start ------------------------------------------------------------------
  const tip = el("div", { id: "tip" });
  document.addEventListener("mouseover", (event) => {
    const token = event.target.closest && event.target.closest(".tok");
    const box = token && token.closest(".tokens");
    if (!box || !box.tip || token.dataset.i === undefined) { tip.style.display = "none"; return; }
    tip.textContent = box.tip(+token.dataset.i);
    const r = token.getBoundingClientRect();
    tip.style.display = "block";
    tip.style.left = `${Math.min(r.left, window.innerWidth - 470)}px`;
    tip.style.top = `${r.bottom + 4 + 120 > window.innerHeight ? r.top - tip.offsetHeight - 4 : r.bottom + 4}px`;
  });
  function showError(err, where) {
    const box = el("div", { class: "error", text: String(err.message || err) });
    if (where) put(where, box); else $("header").append(box);
  }
  async function loadRows(fresh) {
    for (;;) {
      const answer = await api.rows(state.rows.length, state.moved);
      if (answer.generation !== state.generation) return false;
      for (const r of answer.rows) {
        state.rows.push(r);
        state.byN.set(r.n, r);
        if (fresh) state.fresh.add(r.n);
      }
      for (const r of answer.moved) {
        state.rows[r.n] = r;
        state.byN.set(r.n, r);
      }
      state.moved = answer.moved_count;
      if (state.status) state.status.shards = answer.shards || state.status.shards;
      if (!answer.rows.length || state.rows.length >= answer.groups) return true;
    }
  }
  let facets = "";
  function facetKey() {
    return JSON.stringify([state.rows.flatMap((r) => Object.keys(r.stages)).filter((v, i, a) => a.indexOf(v) === i).sort(),
      state.rows.flatMap((r) => Object.keys(r.meta)).filter((v, i, a) => a.indexOf(v) === i).sort(),
      state.rows.some((r) => r.teacher), state.rows.some((r) => r.policies)]);
  }
  async function poll() {
    let s;
    try { s = await api.status(); } catch (err) { return; }
    if (s.generation !== state.generation) {
      Object.assign(state, { rows: [], byN: new Map(), moved: 0, generation: s.generation, group: null, opened: null });
      put($("main"), el("div", { class: "warn", text: "The folder was overwritten: the list starts over." }));
    }
    state.status = s;
    const before = state.rows.length;
    await loadRows(true);
    renderHeader();
    if (state.rows.length !== before || facetKey() !== facets) {
      if (facetKey() !== facets && !$("#filters").contains(document.activeElement)) { facets = facetKey(); renderFilters(); }
      if (state.hitsFor) await search(); else renderList();
    }
    if (s.live) setTimeout(poll, 2000);
  }
  window.addEventListener("hashchange", () => {
    const f = readHash();
    const reopen = f.g !== state.filter.g;
    state.filter = f;
    renderFilters();
    refresh();
    if (reopen && f.g !== "") openGroup(+f.g, true);
  });
  document.addEventListener("keydown", (event) => {
    if (event.target.closest && event.target.closest("input, select, textarea")) return;
    if (event.key === "/") { event.preventDefault(); $("#f-q").focus(); return; }
    if (event.key !== "j" && event.key !== "k") return;
    const rows = shown();
    const at = rows.findIndex((r) => r.n === state.opened);
    const next = rows[Math.max(0, Math.min(rows.length - 1, at + (event.key === "j" ? 1 : -1)))];
    if (next) {
      state.filter.page = String(Math.floor(rows.indexOf(next) / PAGE));
      openGroup(next.n);
      renderList();
    }
  });
  async function boot() {
    document.body.append(tip);
    state.filter = readHash();
    try {
      state.status = await api.status();
      state.generation = state.status.generation;
      await loadRows(false);
    } catch (err) { return showError(err); }
    facets = facetKey();
    renderHeader();
    renderFilters();
    if (state.filter.q) await search(); else renderList();
    if (state.filter.g !== "") await openGroup(+state.filter.g, true);
    else put($("main"), el("p", { class: "note", text: "Open a group from the list (or press j / k; / searches)." }));
    document.body.dataset.ready = "1";
    if (!INLINE && state.status.live) setTimeout(poll, 2000);
  }
  boot();
})();
