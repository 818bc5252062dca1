// agentroll view, the page's script (part 2 of 3, see view.js): a record shown whole: its facts, its tokens as
// coloured spans and their tooltips, the legend, its tool calls.
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
    if (t.kept) lines.push(`sampling mask: ${t.kept[i]} token${t.kept[i] === 1 ? "" : "s"} survived top-k / top-p at this step`);
    if (t.tl) lines.push(`teacher logprob ${t.tl[i]}` + (t.trank ? ` · rank ${t.trank[i] ?? "-"}` : "") +
      ` · |student − teacher| ${fmt(Math.abs(t.lp[i] - t.tl[i]), 4)}`);
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
    const command = g.where.zstd ? `zstdcat ${shellWord(g.where.path)} | sed -n '${rec.line}p'` : `sed -n '${rec.line}p' ${shellWord(g.where.path)}`;
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
      .concat(Object.entries(rec.extra || {}).map(([k2, v]) => [k2, json(v)]))
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
