// serve_client.mjs — drives `dsv4 serve` with the official `openai` npm client
// (run by tests/test_serve.sh). Usage: node serve_client.mjs MODE BASE_URL KEY [BASE_URL2]
//   api     chat / completions, streaming and not, tools, thinking, logprobs, stop, errors
//   repro   one seeded request (T 0.8) alone and under 32 concurrent streams: same text; prints it
//   load    64 concurrent streams, each equal to its solo run, twice; memory flat (BASE_URL2: the pid)
//   prefix  a second turn reusing the first turn's sequence equals it on a server without reuse (BASE_URL2)
import OpenAI from 'openai';
import assert from 'node:assert/strict';
import {readFileSync} from 'node:fs';

const [mode, base, key, base2] = process.argv.slice(2);
const client = new OpenAI({baseURL: base + '/v1', apiKey: key, maxRetries: 0, timeout: 120000});
const model = (await client.models.list()).data[0].id;
const log = (...a) => console.error('[serve_client]', ...a);

async function chatText(req) {
  const r = await client.chat.completions.create({model, ...req});
  return r;
}
async function chatStream(req) {
  const s = await client.chat.completions.create({model, ...req, stream: true, stream_options: {include_usage: true}});
  let content = '', reasoning = '', finish = null, usage = null, chunks = 0, calls = [];
  for await (const c of s) {
    chunks++;
    if (c.usage) usage = c.usage;
    const ch = c.choices[0];
    if (!ch) continue;
    if (ch.delta.content) content += ch.delta.content;
    if (ch.delta.reasoning_content) reasoning += ch.delta.reasoning_content;
    if (ch.delta.tool_calls) calls.push(...ch.delta.tool_calls);
    if (ch.finish_reason) finish = ch.finish_reason;
  }
  return {content, reasoning, finish, usage, chunks, calls};
}
async function complStream(req) {
  const s = await client.completions.create({model, ...req, stream: true});
  let text = '', finish = null;
  for await (const c of s) {
    if (c.choices[0]) {
      text += c.choices[0].text;
      if (c.choices[0].finish_reason) finish = c.choices[0].finish_reason;
    }
  }
  return {text, finish};
}
const user = (t) => [{role: 'user', content: t}];

async function api() {
  const expectErr = async (p, status, what) => {
    try { await p; } catch (e) { assert.equal(e.status, status, what + ': ' + e.message); assert.ok(e.error?.message || e.message); return; }
    assert.fail(what + ': no error');
  };
  // chat, non-streaming and streaming: same seed -> same text; usage adds up
  const req = {messages: [{role: 'system', content: 'Answer in the words of scripture.'}, ...user('Who made the heaven?')],
               max_tokens: 24, seed: 7, temperature: 0.8};
  const a = await chatText(req);
  const m = a.choices[0].message;
  assert.equal(m.role, 'assistant');
  assert.ok(typeof m.content === 'string' && m.content.length > 0, 'chat content');
  assert.ok(['stop', 'length'].includes(a.choices[0].finish_reason));
  assert.equal(a.usage.total_tokens, a.usage.prompt_tokens + a.usage.completion_tokens);
  assert.ok(a.usage.completion_tokens >= 1 && a.usage.completion_tokens <= 24);
  const b = await chatStream(req);
  assert.equal(b.content, m.content, 'streamed chat = non-streamed chat');
  assert.equal(b.finish, a.choices[0].finish_reason);
  assert.equal(b.usage.completion_tokens, a.usage.completion_tokens);
  assert.ok(b.chunks >= 3);
  log('chat ok:', JSON.stringify(m.content));

  // content as a list of text parts = the same text as a string
  const parts = await chatText({...req, messages: [req.messages[0], {role: 'user', content: [
    {type: 'text', text: 'Who made '}, {type: 'text', text: 'the heaven?'}]}]});
  assert.equal(parts.choices[0].message.content, m.content, 'text parts = string content');

  // completions, both ways
  const creq = {prompt: 'And God said', max_tokens: 12, seed: 3, temperature: 0.8};
  const c = await client.completions.create({model, ...creq});
  assert.ok(c.choices[0].text.length > 0);
  assert.equal(c.usage.completion_tokens, 12, 'no EOS expected this early? ' + JSON.stringify(c.choices[0]));
  const cs = await complStream(creq);
  assert.equal(cs.text, c.choices[0].text, 'streamed completion = non-streamed');
  assert.equal(cs.finish, 'length');

  // stop strings: the text ends right before the first occurrence (expected from the unstopped text)
  const words = c.choices[0].text.split(' ').filter((w) => w.length >= 3);
  const stopWord = words[Math.floor(words.length / 2)];
  const cut = c.choices[0].text.slice(0, c.choices[0].text.indexOf(stopWord));
  const st = await client.completions.create({model, ...creq, stop: [stopWord]});
  assert.equal(st.choices[0].text, cut, 'stop string cut');
  assert.equal(st.choices[0].finish_reason, 'stop');
  assert.equal((await complStream({...creq, stop: stopWord})).text, cut, 'streamed stop string cut');

  // logprobs: one entry per token, the alternatives sorted, the chosen one among a proper distribution
  const lp = await chatText({...req, logprobs: true, top_logprobs: 3});
  const ent = lp.choices[0].logprobs.content;
  assert.equal(ent.length, lp.usage.completion_tokens);
  for (const e of ent) {
    assert.ok(e.logprob <= 0 && e.top_logprobs.length === 3);
    assert.ok(e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob && e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob);
    assert.ok(e.logprob <= e.top_logprobs[0].logprob);
    assert.ok(Math.exp(e.top_logprobs[0].logprob) + Math.exp(e.top_logprobs[1].logprob) <= 1.000001);
  }
  assert.equal(ent.map((e) => e.token).join(''), lp.choices[0].message.content, 'logprob tokens spell the content');

  // tools: a conversation with a call, its result and null assistant content
  const tools = [{type: 'function', function: {name: 'get_verse', description: 'Look up a verse',
    parameters: {type: 'object', properties: {book: {type: 'string'}, chapter: {type: 'integer'}}, required: ['book']}}}];
  const tmsgs = [...user('Read me John 3'),
    {role: 'assistant', content: null, tool_calls: [{id: 'call_1', type: 'function',
      function: {name: 'get_verse', arguments: '{"book": "John", "chapter": 3}'}}]},
    {role: 'tool', tool_call_id: 'call_1', content: 'For God so loved the world'}];
  const t = await chatText({messages: tmsgs, tools, tool_choice: 'auto', max_tokens: 16, seed: 1});
  assert.ok(['stop', 'length', 'tool_calls'].includes(t.choices[0].finish_reason));
  assert.ok(t.usage.prompt_tokens > 100, 'the tool schema is in the prompt: ' + t.usage.prompt_tokens);
  const tn = await chatText({messages: tmsgs, tools, tool_choice: 'none', max_tokens: 16, seed: 1});
  assert.ok(tn.usage.prompt_tokens < t.usage.prompt_tokens, 'tool_choice none drops the schema');
  const ts = await chatStream({messages: tmsgs, tools, max_tokens: 16, seed: 1});
  assert.equal(ts.content, t.choices[0].message.content ?? '');

  // tool_choice "required" / a named function: the reply is one grammar-constrained DSML tool call
  // (as the V4 encoder renders an assistant's calls), parsed back into tool_calls; cut by
  // max_tokens it stays content. Either way it opens with the block, streamed or not
  // (tests/serve_structured.mjs validates complete calls).
  const OPEN = '\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="';
  const forced = async (tool_choice, extra = {}) => {
    const q = {messages: user('Read me John 3'), tools, tool_choice, max_tokens: 40, seed: 3, ...extra};
    const a = await chatText(q);
    const s = await chatStream(q);
    const m = a.choices[0].message;
    if (m.tool_calls) {
      assert.equal(a.choices[0].finish_reason, 'tool_calls');
      assert.equal(m.content, null);
      assert.ok(m.tool_calls[0].id && m.tool_calls[0].type === 'function');
      assert.equal(s.calls[0].function.name, m.tool_calls[0].function.name, 'streamed tool call');
    } else {
      assert.equal(s.content, m.content, 'streamed content = content (forced call not closed)');
    }
    return {a, m};
  };
  const req1 = await forced('required');
  const text1 = req1.m.tool_calls ? OPEN : req1.m.content;
  assert.ok(text1.startsWith(OPEN), 'required: the reply opens a tool call: ' + JSON.stringify(text1));
  const named = await forced({type: 'function', function: {name: 'get_verse'}});
  if (named.m.tool_calls) assert.equal(named.m.tool_calls[0].function.name, 'get_verse');
  else assert.ok(named.m.content.startsWith(OPEN + 'get_verse">\n'), 'named: ' + JSON.stringify(named.m.content));
  const auto = await chatText({messages: user('Read me John 3'), tools, max_tokens: 24, seed: 3});
  assert.equal(named.a.usage.prompt_tokens, auto.usage.prompt_tokens, 'the forced call is part of the completion');
  const thr = await forced('required', {reasoning_effort: 'high'});
  assert.equal(typeof thr.m.reasoning_content, 'string', 'thinking + required: reasoning first');
  await expectErr(client.chat.completions.create({model, messages: user('hi'), tools,
    tool_choice: {type: 'function', function: {name: 'nope'}}}), 400, 'unknown forced function');
  await expectErr(client.chat.completions.create({model, messages: user('hi'), tool_choice: 'required'}), 400,
    'required without tools');

  // n choices: choice i is the request alone with seed + i, streamed or not, chat and completions
  const nreq = {messages: user('Who made the heaven?'), max_tokens: 12, seed: 40, temperature: 0.9};
  const three = await chatText({...nreq, n: 3});
  assert.equal(three.choices.length, 3);
  let sum = 0;
  for (let i = 0; i < 3; i++) {
    assert.equal(three.choices[i].index, i);
    const one = await chatText({...nreq, seed: 40 + i});
    assert.equal(three.choices[i].message.content, one.choices[0].message.content, 'choice ' + i + ' = seed + ' + i);
    assert.equal(three.choices[i].finish_reason, one.choices[0].finish_reason);
    sum += one.usage.completion_tokens;
  }
  assert.equal(three.usage.completion_tokens, sum, 'usage adds the choices');
  assert.equal(three.usage.prompt_tokens, (await chatText(nreq)).usage.prompt_tokens, 'the prompt counted once');
  const ns = await client.chat.completions.create({model, ...nreq, n: 3, stream: true});
  const got = ['', '', ''], fin = [null, null, null];
  for await (const c of ns) for (const ch of c.choices) {
    if (ch.delta.content) got[ch.index] += ch.delta.content;
    if (ch.finish_reason) fin[ch.index] = ch.finish_reason;
  }
  for (let i = 0; i < 3; i++) {
    assert.equal(got[i], three.choices[i].message.content, 'streamed choice ' + i);
    assert.equal(fin[i], three.choices[i].finish_reason);
  }
  const cn = await client.completions.create({model, prompt: 'And God said', max_tokens: 8, seed: 9, temperature: 0.9, n: 2});
  assert.equal(cn.choices.length, 2);
  for (let i = 0; i < 2; i++)
    assert.equal(cn.choices[i].text, (await client.completions.create({model, prompt: 'And God said', max_tokens: 8,
      seed: 9 + i, temperature: 0.9})).choices[0].text, 'completion choice ' + i);
  assert.notEqual(three.choices[0].message.content + three.choices[1].message.content + three.choices[2].message.content,
    three.choices[0].message.content.repeat(3), 'the choices are not all the same');

  // thinking: reasoning_content in the reply, streamed as reasoning deltas
  const th = await chatText({messages: user('Why?'), reasoning_effort: 'high', max_tokens: 16, seed: 2});
  const tm = th.choices[0].message;
  assert.equal(typeof tm.reasoning_content, 'string');
  assert.ok(tm.reasoning_content.length + tm.content.length > 0);
  const ths = await chatStream({messages: user('Why?'), reasoning_effort: 'high', max_tokens: 16, seed: 2});
  assert.equal(ths.reasoning, tm.reasoning_content, 'streamed reasoning');
  assert.equal(ths.content, tm.content, 'streamed content after reasoning');
  const nt = await chatText({messages: user('Why?'), max_tokens: 16, seed: 2});
  assert.equal(nt.choices[0].message.reasoning_content, undefined, 'no reasoning in chat mode');
  assert.equal(th.usage.prompt_tokens, nt.usage.prompt_tokens, 'the prompt ends in <think> instead of </think>');

  // errors the client sees as typed exceptions
  await expectErr(client.chat.completions.create({model: 'gpt-4o', messages: user('hi')}), 404, 'unknown model');
  await expectErr(client.chat.completions.create({model, messages: user('hi'), temperature: 'hot'}), 400, 'wrong type');
  await expectErr(client.chat.completions.create({model, messages: user('hi'), max_tokens: 1e9}), 400, 'absurd max_tokens');
  await expectErr(client.chat.completions.create({model, messages: [{role: 'wizard', content: 'x'}]}), 400, 'bad role');
  const bad = new OpenAI({baseURL: base + '/v1', apiKey: 'wrong-key', maxRetries: 0});
  await expectErr(bad.chat.completions.create({model, messages: user('hi')}), 401, 'wrong API key');
  log('api ok');
}

const fixed = {messages: user('Tell me of the flood and the ark.'), max_tokens: 40, seed: 1234, temperature: 0.8};
function rnd(seed) { let x = seed; return () => (x = (x * 1103515245 + 12345) % 2147483648) / 2147483648; }

async function repro() {
  const alone = (await chatStream(fixed)).content;
  const r = rnd(99);
  const others = [];
  for (let i = 0; i < 32; i++) {
    const words = Array.from({length: 1 + Math.floor(r() * 60)}, (_, k) => ['and', 'the', 'LORD', 'spake', 'unto', 'Moses'][k % 6]).join(' ');
    others.push(chatStream({messages: user(words), max_tokens: 5 + Math.floor(r() * 60), seed: i, temperature: 1.0}));
  }
  await new Promise((res) => setTimeout(res, 50)); // the others are running
  const loaded = (await chatStream(fixed)).content;
  await Promise.all(others);
  assert.equal(loaded, alone, 'same request alone vs under 32 concurrent streams');
  process.stdout.write(JSON.stringify(alone) + '\n');
  log('repro ok');
}

async function load() {
  // base2 here: the server's pid, for its resident memory after each round
  const rss = () => Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${base2}/status`, 'utf8'))[1]);
  const n = 64, r = rnd(7), reqs = [];
  for (let i = 0; i < n; i++)
    reqs.push({prompt: ['In the beginning', 'And Jesus said', 'Blessed is the man', 'The LORD'][i % 4] + ' ' + 'and'.repeat(i % 5),
               max_tokens: 6 + Math.floor(r() * 12), seed: 100 + i, temperature: 0.8});
  const solo = [];
  for (const q of reqs) solo.push((await complStream(q)).text);
  const mem = [];
  for (let round = 0; round < 2; round++) {
    const t0 = Date.now();
    const all = await Promise.all(reqs.map((q) => complStream(q)));
    const dt = (Date.now() - t0) / 1000;
    for (let i = 0; i < n; i++) assert.equal(all[i].text, solo[i], 'stream ' + i + ' under load = solo');
    mem.push(rss());
    log(`load round ${round}: ${n} concurrent streams in ${dt.toFixed(2)} s, server RSS ${mem[round]} kB`);
  }
  assert.ok(mem[1] <= mem[0] * 1.1 + 4096, `memory grew from ${mem[0]} kB to ${mem[1]} kB over a second round`);
}

async function prefix() {
  const other = new OpenAI({baseURL: base2 + '/v1', apiKey: key, maxRetries: 0});
  const t1 = await chatText({messages: user('Who was Noah?'), max_tokens: 20, seed: 5, temperature: 0});
  const conv = [...user('Who was Noah?'), {role: 'assistant', content: t1.choices[0].message.content}, ...user('And his sons?')];
  const req = {model, messages: conv, max_tokens: 20, seed: 6, temperature: 0.8, logprobs: true, top_logprobs: 5};
  const reused = await client.chat.completions.create(req);
  const fresh = await other.chat.completions.create(req);
  if (t1.choices[0].finish_reason === 'stop')
    assert.ok(reused.usage.prompt_tokens_details.cached_tokens > 0, 'the second turn reused the first: ' + JSON.stringify(reused.usage));
  assert.equal(fresh.usage.prompt_tokens_details.cached_tokens, 0);
  assert.deepEqual(reused.choices[0], fresh.choices[0], 'reused prefix = fresh prefill (text and log-probabilities)');
  log('prefix ok: cached', reused.usage.prompt_tokens_details.cached_tokens, 'of', reused.usage.prompt_tokens);
}

await {api, repro, load, prefix}[mode]();
