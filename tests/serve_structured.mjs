// serve_structured.mjs — structured output of `dsv4 serve` checked by independent code (run by
// tests/test_serve_structured.sh). Usage: node serve_structured.mjs MODE BASE_URL KEY [N]
//   gen      N random JSON schemas, two seeds each, through response_format json_schema; every
//            reply that ends (finish_reason "stop") must parse and validate with ajv; the seeded
//            replies of one schema sent alone and among the others are the same text
//   clients  the Vercel AI SDK (toolChoice "required") and LangChain JS (bindTools, tool_choice
//            "required"; with parallel_tool_calls false one call) get tool calls whose arguments
//            validate, every call of a reply checked; the openai client's json_schema
//            and json_object replies parse and validate
//   tools    N seeds (12) of parallel tool calls under tool_choice "required": some reply holds
//            several calls, each valid (ajv) for the tool it names, ids distinct, the streamed calls
//            the same as the reply's; parallel_tool_calls false: one call each; 40 tools whose names
//            share a prefix: calls land on tools past the 16th, each valid
import OpenAI from 'openai';
import Ajv from 'ajv';
import assert from 'node:assert/strict';

const [mode, base, key, nArg] = process.argv.slice(2);
const client = new OpenAI({baseURL: base + '/v1', apiKey: key, maxRetries: 0, timeout: 300000});
const model = (await client.models.list()).data[0].id;
const log = (...a) => console.error('[serve_structured]', ...a);
const ajv = new Ajv({strict: false});
const user = (t) => [{role: 'user', content: t}];

// a small deterministic generator (xorshift32)
function rng(seed) {
  let x = seed >>> 0 || 1;
  return () => {
    x ^= x << 13; x >>>= 0; x ^= x >>> 17; x ^= x << 5; x >>>= 0;
    return x / 4294967296;
  };
}

// A random schema of the supported subset, bounded so that every value ends in a few dozen
// tokens: strings with maxLength, arrays with maxItems, objects without additional properties.
function randomSchema(r) {
  const defs = {};
  const words = ['alpha', 'beta', 'gamma', 'id', 'name', 'count', 'ok', 'tags', 'x', 'y', 'note', 'kind'];
  const pick = (a) => a[Math.floor(r() * a.length)];
  function leaf() {
    switch (Math.floor(r() * 8)) {
      case 0: return {type: 'string', maxLength: 1 + Math.floor(r() * 8)};
      case 1: return {type: 'integer'};
      case 2: return {type: 'number'};
      case 3: return {type: 'boolean'};
      case 4: return {enum: ['red', 'green', 7, null].slice(0, 2 + Math.floor(r() * 3))};
      case 5: return {const: pick(['v1', 3, true])};
      case 6: return {type: ['string', 'null'], maxLength: 4};
      default: return {type: 'null'};
    }
  }
  function node(depth) {
    const k = depth >= 2 ? 0 : Math.floor(r() * 6);
    if (k <= 1) return leaf();
    if (k === 2) return {type: 'array', items: node(depth + 1), minItems: Math.floor(r() * 2),
                         maxItems: 1 + Math.floor(r() * 3)};
    if (k === 3) return {anyOf: [node(depth + 1), node(depth + 1)]};
    if (k === 4 && Object.keys(defs).length < 2) {
      const name = 'd' + Object.keys(defs).length;
      defs[name] = true; // taken (a $ref to it comes from outside only: no recursion)
      defs[name] = obj(depth + 1);
      return {$ref: '#/$defs/' + name};
    }
    return obj(depth + 1);
  }
  function obj(depth) {
    const n = 1 + Math.floor(r() * 3), props = {}, req = [];
    for (let i = 0; i < n; i++) {
      const w = words[(Math.floor(r() * words.length) + i) % words.length];
      props[w] = node(depth);
      if (r() < 0.6) req.push(w);
    }
    return {type: 'object', properties: props, required: [...new Set(req)], additionalProperties: false};
  }
  const root = obj(0);
  if (Object.keys(defs).length) root.$defs = defs;
  return root;
}

async function structured(schema, seed, extra = {}) {
  const r = await client.chat.completions.create({
    model, messages: user('Describe the garden of Eden as JSON.'), max_tokens: 256, seed, temperature: 1,
    response_format: {type: 'json_schema', json_schema: {name: 'out', schema, strict: true}}, ...extra});
  return {text: r.choices[0].message.content, finish: r.choices[0].finish_reason};
}

async function pool(n, jobs) {
  const out = new Array(jobs.length);
  let next = 0;
  await Promise.all(Array.from({length: n}, async () => {
    while (next < jobs.length) { const i = next++; out[i] = await jobs[i](); }
  }));
  return out;
}

async function gen() {
  const N = Number(nArg || 100);
  const r = rng(20261207);
  const schemas = Array.from({length: N}, () => randomSchema(r));
  const t0 = Date.now();
  const jobs = [];
  for (let i = 0; i < N; i++) for (const seed of [1, 2]) jobs.push(async () => ({i, seed, ...(await structured(schemas[i], seed))}));
  const res = await pool(16, jobs);
  let stop = 0;
  for (const x of res) {
    const validate = ajv.compile(schemas[x.i]);
    if (x.finish !== 'stop') {
      log(`schema ${x.i} seed ${x.seed}: cut by max_tokens: ${JSON.stringify(x.text.slice(0, 200))}`);
      continue;
    }
    stop++;
    let v;
    try { v = JSON.parse(x.text); } catch (e) { assert.fail(`schema ${x.i} seed ${x.seed}: not JSON: ${x.text}`); }
    assert.ok(validate(v), `schema ${x.i} seed ${x.seed}: ${x.text}\n${JSON.stringify(schemas[x.i])}\n` +
      ajv.errorsText(validate.errors));
  }
  log(`${res.length} replies (${N} schemas x 2 seeds), ${stop} complete and valid (ajv), ` +
      `${res.length - stop} cut by max_tokens, ${((Date.now() - t0) / 1000).toFixed(1)} s`);
  assert.ok(stop >= res.length * 0.9, `only ${stop} of ${res.length} replies completed`);
  // the same request alone gives the same text as among the others
  for (const k of [0, 1, 2]) {
    const a = await structured(schemas[k], 1);
    assert.equal(a.text, res[2 * k].text, `schema ${k}: alone = under load`);
  }
}

async function clients() {
  const {generateText, tool, jsonSchema} = await import('ai');
  const {createOpenAICompatible} = await import('@ai-sdk/openai-compatible');
  const {ChatOpenAI} = await import('@langchain/openai');
  const params = {type: 'object', properties: {book: {type: 'string', maxLength: 12}, chapter: {type: 'integer'},
    verses: {type: 'array', items: {type: 'integer'}, maxItems: 3}}, required: ['book', 'chapter'],
    additionalProperties: false};
  const validate = ajv.compile(params);
  // Vercel AI SDK
  const provider = createOpenAICompatible({name: 'dsv4', baseURL: base + '/v1', apiKey: key});
  for (const seed of [1, 2, 3]) {
    // (room for several calls: the bundled model chains them, and the SDK sends no parallel_tool_calls)
    const r = await generateText({model: provider.chatModel(model), prompt: 'Read me John 3', seed, maxOutputTokens: 1500,
      tools: {get_verse: tool({description: 'Look up a verse', inputSchema: jsonSchema(params)})},
      toolChoice: 'required', maxRetries: 0});
    assert.ok(r.toolCalls.length >= 1, 'ai sdk: a tool call: ' + JSON.stringify(r.text));
    for (const c of r.toolCalls) {
      assert.equal(c.toolName, 'get_verse');
      assert.ok(validate(c.input), 'ai sdk: arguments validate: ' + JSON.stringify(c.input) + ajv.errorsText(validate.errors));
    }
    log('ai sdk tool calls', r.toolCalls.map((c) => JSON.stringify(c.input)).join(' | '));
  }
  // LangChain JS
  const llm = new ChatOpenAI({model, apiKey: key, configuration: {baseURL: base + '/v1'}, maxTokens: 1500, maxRetries: 0});
  const lcTools = [{type: 'function', function: {name: 'get_verse', description: 'Look up a verse',
    parameters: params}}, {type: 'function', function: {name: 'search', parameters: {type: 'object',
    properties: {q: {type: 'string', maxLength: 10}}, required: ['q']}}}];
  const bound = llm.bindTools(lcTools, {tool_choice: 'required'});
  const one = llm.bindTools(lcTools, {tool_choice: 'required', parallel_tool_calls: false});
  for (const [seed, b, what] of [[1, bound, 'required'], [2, bound, 'required'], [1, one, 'one call'], [2, one, 'one call']]) {
    const msg = await b.invoke('Read me John 3', {seed});
    assert.ok(msg.tool_calls?.length >= 1, 'langchain: a tool call: ' + JSON.stringify(msg.content));
    if (b === one) assert.equal(msg.tool_calls.length, 1, 'langchain: parallel_tool_calls false: one call');
    for (const c of msg.tool_calls) {
      assert.ok(['get_verse', 'search'].includes(c.name));
      if (c.name === 'get_verse') assert.ok(validate(c.args), 'langchain: arguments validate: ' + JSON.stringify(c.args));
      else assert.ok(typeof c.args.q === 'string' && c.args.q.length <= 10, 'langchain: search args ' + JSON.stringify(c.args));
    }
    log(`langchain tool calls (${what})`, msg.tool_calls.map((c) => c.name + JSON.stringify(c.args)).join(' | '));
  }
  const named = await llm.bindTools([{type: 'function', function: {name: 'get_verse', parameters: params}}],
    {tool_choice: {type: 'function', function: {name: 'get_verse'}}}).invoke('Read me John 3', {seed: 4});
  assert.ok(named.tool_calls?.[0]?.name === 'get_verse' && validate(named.tool_calls[0].args), 'langchain: named tool');
  // openai: json_schema and json_object
  const schema = {type: 'object', properties: {title: {type: 'string', maxLength: 16}, year: {type: 'integer'},
    good: {type: 'boolean'}}, required: ['title', 'year', 'good'], additionalProperties: false};
  const vs = ajv.compile(schema);
  const s = await structured(schema, 5);
  assert.equal(s.finish, 'stop');
  assert.ok(vs(JSON.parse(s.text)), 'json_schema reply validates: ' + s.text);
  const st = await client.chat.completions.create({model, messages: user('Describe the garden of Eden as JSON.'), max_tokens: 256,
    seed: 5, temperature: 1, stream: true,
    response_format: {type: 'json_schema', json_schema: {name: 'out', schema, strict: true}}});
  let streamed = '';
  for await (const c of st) streamed += c.choices[0]?.delta?.content ?? '';
  assert.equal(streamed, s.text, 'streamed json_schema reply = the reply');
  const o = await client.chat.completions.create({model, messages: user('JSON please'), max_tokens: 200, seed: 6,
    response_format: {type: 'json_object'}});
  if (o.choices[0].finish_reason === 'stop') {
    const v = JSON.parse(o.choices[0].message.content);
    assert.ok(v && typeof v === 'object' && !Array.isArray(v), 'json_object: an object');
  }
  // thinking mode: the structure starts after the reasoning
  const th = await structured(schema, 7, {reasoning_effort: 'high', max_tokens: 400});
  if (th.finish === 'stop') assert.ok(vs(JSON.parse(th.text)), 'thinking + json_schema validates: ' + th.text);
  log('json_schema', s.text, '| json_object', o.choices[0].message.content.slice(0, 60));
}

// the tool calls of a reply, each checked against its tool's parameters (ajv)
function checkCalls(r, tools, what) {
  const msg = r.choices[0].message;
  assert.equal(r.choices[0].finish_reason, 'tool_calls', `${what}: finish_reason ${r.choices[0].finish_reason}: ` +
    JSON.stringify(msg).slice(0, 300));
  const calls = msg.tool_calls;
  assert.ok(Array.isArray(calls) && calls.length >= 1, `${what}: no tool call`);
  assert.equal(new Set(calls.map((c) => c.id)).size, calls.length, `${what}: ids distinct`);
  for (const c of calls) {
    const t = tools.find((x) => x.function.name === c.function.name);
    assert.ok(t, `${what}: a call of an unknown tool ${c.function.name}`);
    const v = ajv.compile(t.function.parameters);
    const args = JSON.parse(c.function.arguments);
    assert.ok(v(args), `${what}: ${c.function.name} ${c.function.arguments}: ${ajv.errorsText(v.errors)}`);
  }
  return calls;
}

async function tools() {
  const fn = (name, parameters) => ({type: 'function', function: {name, parameters}});
  const two = [
    fn('get_verse', {type: 'object', properties: {book: {type: 'string', maxLength: 12}, chapter: {type: 'integer'}},
      required: ['book', 'chapter'], additionalProperties: false}),
    fn('search', {type: 'object', properties: {q: {type: 'string', maxLength: 10}}, required: ['q']})];
  const ask = (extra) => client.chat.completions.create({model, messages: user('Read me John 3'), max_tokens: 200,
    tools: two, tool_choice: 'required', temperature: 1, ...extra});
  // the requests of each group are sent together (the server batches them; seeded replies are
  // the same alone or under load)
  const seeds = (n) => Array.from({length: n}, (_, i) => i + 1);
  const N = Number(nArg || 12); // seeds of the parallel group (half as many one-call, 2/3 with 40 tools)
  const replies = await Promise.all(seeds(N).map((seed) => ask({seed})));
  let most = 0, complete = 0;
  const several = [];
  for (const [i, r] of replies.entries()) {
    const seed = i + 1;
    if (r.choices[0].finish_reason === 'length') { // calls after calls until max_tokens
      log(`parallel seed ${seed}: cut by max_tokens`);
      continue;
    }
    complete++;
    const calls = checkCalls(r, two, `parallel seed ${seed}`);
    most = Math.max(most, calls.length);
    if (calls.length > 1) several.push([seed, calls]);
    log(`parallel seed ${seed}: ${calls.map((c) => c.function.name + c.function.arguments).join(' | ')}`);
  }
  assert.ok(complete >= N / 2 && most >= 2, `${complete} of ${N} replies complete, the most calls in one ${most}`);
  // a reply of several calls streamed: the same calls, indexed 0..n-1
  await Promise.all(several.map(async ([seed, calls]) => {
    const got = [];
    for await (const c of await ask({seed, stream: true}))
      for (const t of c.choices[0]?.delta?.tool_calls ?? []) got[t.index] = t;
    assert.deepEqual(got.map((c) => [c.function.name, c.function.arguments]),
      calls.map((c) => [c.function.name, c.function.arguments]), `parallel seed ${seed}: streamed calls`);
  }));
  const ones = await Promise.all(seeds(Math.ceil(N / 2)).map((seed) => ask({seed, parallel_tool_calls: false})));
  for (const [i, r] of ones.entries()) {
    const calls = checkCalls(r, two, `one call seed ${i + 1}`);
    assert.equal(calls.length, 1, `parallel_tool_calls false, seed ${i + 1}: ${calls.length} calls`);
  }
  // 40 tools whose names share the prefix "lookup_" (one call a reply): calls reach past the 16th tool
  const forty = Array.from({length: 40}, (_, i) => fn(`lookup_${String(i).padStart(2, '0')}`, {type: 'object',
    properties: {[`key${i}`]: {type: 'integer'}}, required: [`key${i}`], additionalProperties: false}));
  const names = new Set();
  const fr = await Promise.all(seeds(Math.ceil((2 * N) / 3)).map((seed) => client.chat.completions.create({model,
    messages: user('Look it up'), max_tokens: 400, seed, tools: forty, tool_choice: 'required', temperature: 1,
    parallel_tool_calls: false})));
  for (const [i, r] of fr.entries()) for (const c of checkCalls(r, forty, `40 tools seed ${i + 1}`)) names.add(c.function.name);
  const late = [...names].filter((n) => Number(n.slice(7)) >= 16);
  log(`40 tools: called ${[...names].sort().join(' ')}`);
  assert.ok(late.length > 0, `40 tools: no call of a tool past the 16th (${[...names].join(' ')})`);
  const named = await client.chat.completions.create({model, messages: user('Look it up'), max_tokens: 400, seed: 1,
    tools: forty, tool_choice: {type: 'function', function: {name: 'lookup_39'}}, parallel_tool_calls: false});
  const nc = checkCalls(named, forty, '40 tools, lookup_39 named');
  assert.ok(nc.length === 1 && nc[0].function.name === 'lookup_39', '40 tools: the named tool');
}

if (mode === 'gen') await gen();
else if (mode === 'clients') await clients();
else if (mode === 'tools') await tools();
else throw new Error('mode: gen, clients or tools');
