// bench_serve.mjs — load generator for `dsv4 serve` (Node 18+, no packages).
//   node tools/bench_serve.mjs URL [--conc 1,8,32] [--tokens 64] [--rounds 2] [--mode waves|free]
//                              [--key KEY] [--json]
// At each concurrency C, `rounds` times C streaming completions (different
// prompts, max_tokens = tokens). --mode waves (the default): a round is a wave,
// its C requests sent together and the next wave sent when all of them have
// ended, so a wave's prompts are prefilled together and its streams then
// decode together, as `dsv4 bench --batch C` measures the engine (prefills
// first, then C sequences decoding). --mode free: C workers each send their
// requests one after the other, so new prompts are prefilled inside the other
// streams' decoding (a server's steady state; the decode rate then includes
// that prefill work). Reports output tokens/s over the level's wall time,
// decode tokens/s (the tokens after each stream's first over the summed
// per-stream time from its first token to its end, times C), time to first
// token and time per output token (p50 / p99), and the CPU this client itself
// used over the level's wall time (client_cpu: 0.5 = half a core; on a small
// machine it is taken from the server it measures). --json: one JSON object
// per level instead of the table (scripts/bench-serve.sh reads it).
import http from 'node:http';

const args = process.argv.slice(2);
const url = args[0];
const opt = (k, d) => { const i = args.indexOf(k); return i >= 0 ? args[i + 1] : d; };
const levels = opt('--conc', '1,8,32').split(',').map(Number);
const tokens = Number(opt('--tokens', '64'));
const rounds = Number(opt('--rounds', '2'));
const mode = opt('--mode', 'waves');
if (mode !== 'waves' && mode !== 'free') { console.error(`bench_serve: --mode is waves or free, not '${mode}'`); process.exit(2); }
const key = opt('--key', process.env.DSV4_API_KEY || '');
const json = args.includes('--json');
const agent = new http.Agent({keepAlive: true, maxSockets: 1024});
const prompts = ['In the beginning God created', 'And the LORD spake unto Moses, saying', 'Blessed are the poor in spirit',
  'The LORD is my shepherd', 'And it came to pass in those days', 'For God so loved the world'];

// One streaming completion over node:http (not fetch: its web streams cost
// several times more CPU per event, and on a small machine the client shares
// the cores with the server it measures). Per event only a cheap scan: the
// first event whose text is non-empty stamps the first token; the usage event
// (include_usage) gives the token count. No JSON.parse but for that one event.
function one(i) {
  const body = JSON.stringify({prompt: prompts[i % prompts.length], max_tokens: tokens, temperature: 0.8, seed: i,
                               stream: true, stream_options: {include_usage: true}});
  const t0 = performance.now();
  return new Promise((resolve, reject) => {
    const req = http.request(url + '/v1/completions', {method: 'POST', agent,
      headers: {'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(body),
                ...(key ? {Authorization: 'Bearer ' + key} : {})}}, (res) => {
      res.setEncoding('utf8');
      if (res.statusCode !== 200) {
        let e = '';
        res.on('data', (d) => { e += d; });
        res.on('end', () => reject(new Error('HTTP ' + res.statusCode + ': ' + e)));
        return;
      }
      let buf = '', first = 0, n = 0;
      res.on('data', (d) => {
        buf += d;
        let k;
        while ((k = buf.indexOf('\n\n')) >= 0) {
          const ev = buf.slice(0, k); buf = buf.slice(k + 2);
          if (!first && ev.startsWith('data: {') && !ev.includes('"text":""') && ev.includes('"text":"'))
            first = performance.now();
          if (ev.startsWith('data: {') && ev.includes('"usage":{')) n = JSON.parse(ev.slice(6)).usage.completion_tokens;
        }
      });
      res.on('end', () => {
        const t1 = performance.now();
        if (!first) first = t1; // no text at all (every token held back or empty): all of it was waiting
        resolve({ttft: (first - t0) / 1000, tpot: n > 1 ? (t1 - first) / 1000 / (n - 1) : 0, n, t0, first, t1});
      });
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(body);
  });
}

const pct = (a, p) => { const s = [...a].sort((x, y) => x - y); return s[Math.min(s.length - 1, Math.floor(p / 100 * s.length))]; };
if (!json) console.log('conc  requests  out_tok/s  decode_tok/s  ttft_p50  ttft_p99  tpot_p50  tpot_p99   (seconds)  client_cpu');
for (const c of levels) {
  await Promise.all(Array.from({length: c}, (_, w) => one(w))); // warm-up round
  const t0 = performance.now(), cpu0 = process.cpuUsage();
  let all = [];
  if (mode === 'waves') {
    for (let r = 0; r < rounds; r++) {
      const wave = await Promise.all(Array.from({length: c}, (_, w) => one(1000 * c + w * rounds + r)));
      all.push(...wave);
    }
  } else {
    all = (await Promise.all(Array.from({length: c}, async (_, w) => {
      const out = [];
      for (let r = 0; r < rounds; r++) out.push(await one(1000 * c + w * rounds + r));
      return out;
    }))).flat();
  }
  const wall = (performance.now() - t0) / 1000;
  const cpu = process.cpuUsage(cpu0), client_cpu = (cpu.user + cpu.system) / 1e6 / wall;
  const total = all.reduce((s, r) => s + r.n, 0);
  // decode rate: tokens after the first of each stream over the summed per-stream decode time, times C
  const dec = all.reduce((s, r) => s + (r.n - 1), 0) / all.reduce((s, r) => s + (r.t1 - r.first) / 1000, 0) * c;
  const f = (x) => x.toFixed(4).padStart(8);
  if (json) {
    console.log(JSON.stringify({conc: c, mode, requests: all.length, out_tok_s: total / wall, decode_tok_s: dec,
      ttft_p50: pct(all.map((r) => r.ttft), 50), ttft_p99: pct(all.map((r) => r.ttft), 99),
      tpot_p50: pct(all.map((r) => r.tpot), 50), tpot_p99: pct(all.map((r) => r.tpot), 99), client_cpu}));
    continue;
  }
  console.log(`${String(c).padStart(4)}  ${String(all.length).padStart(8)}  ${(total / wall).toFixed(1).padStart(9)}  ` +
    `${dec.toFixed(1).padStart(12)}  ${f(pct(all.map((r) => r.ttft), 50))}  ${f(pct(all.map((r) => r.ttft), 99))}  ` +
    `${f(pct(all.map((r) => r.tpot), 50))}  ${f(pct(all.map((r) => r.tpot), 99))}  ${client_cpu.toFixed(2).padStart(10)}`);
}
