// agentroll view, the page's script (part 3 of 3, see view.js): a group in its system's shape, a record's
// view; the tooltip, following the run, the keys, the start.
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
        r.pass[0] ? el("span", {}, "executions solved ", el("b", { text: `${r.pass[1]} of ${r.pass[0]}` })) : null,
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
          own.pass[0] ? el("span", {}, "executions solved ", el("b", { text: `${own.pass[1]} of ${own.pass[0]}` })) : null) : null,
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
  async function loadRows(fresh) {  // the rows of the window [base, base + state.window) of the folder's groups
    for (;;) {
      const answer = await api.rows(state.base + state.rows.length, state.moved);
      if (answer.generation !== state.generation) return false;
      for (const r of answer.rows.slice(0, state.window - state.rows.length)) {
        state.rows.push(r);
        state.byN.set(r.n, r);
        if (fresh) state.fresh.add(r.n);
      }
      for (const r of answer.moved) {
        if (r.n >= state.base && r.n < state.base + state.rows.length) {
          state.rows[r.n - state.base] = r;
          state.byN.set(r.n, r);
        }
      }
      state.moved = answer.moved_count;
      state.total = answer.groups;
      if (state.status) state.status.shards = answer.shards || state.status.shards;
      if (!answer.rows.length || state.rows.length >= state.window || state.base + state.rows.length >= answer.groups) return true;
    }
  }
  async function moveWindow(base) {
    Object.assign(state, { base, rows: [], byN: new Map(), fresh: new Set(), moved: 0 });
    state.filter.from = base ? String(base) : "";
    state.filter.page = "";
    await loadRows(false);
    renderFilters();
    refresh();
  }
  let facets = "";
  function keys(pick) {
    const found = new Set();
    for (const r of state.rows) for (const k of Object.keys(pick(r))) found.add(k);
    return [...found].sort();
  }
  function facetKey() {
    return JSON.stringify([keys((r) => r.stages), keys((r) => r.meta), state.rows.some((r) => r.teacher),
      state.rows.some((r) => r.policies), Math.floor(state.total / state.window)]);
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
      state.window = state.status.window || Infinity;
      const from = +state.filter.from || 0;
      state.base = Number.isFinite(state.window) ? Math.max(0, Math.floor(from / state.window) * state.window) : 0;
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
