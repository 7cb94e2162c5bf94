// serve_page.mjs — the chat page of `dsv4 serve` in headless Chromium (run by
// tests/test_serve_page.sh): load /, type a message, send it, wait for the
// streamed reply, and check it equals the reply the API streams for the same
// request (same messages, seed and max_tokens).  Usage: node serve_page.mjs URL KEY CHROMIUM
import puppeteer from 'puppeteer-core';
import assert from 'node:assert/strict';

const [url, key, chromium] = process.argv.slice(2);
const browser = await puppeteer.launch({executablePath: chromium, headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage']});
try {
  const page = await browser.newPage();
  await page.goto(url + '/', {waitUntil: 'load'});
  await page.type('#key', key);
  await page.$eval('#seed', (e) => { e.value = '11'; });
  await page.$eval('#max', (e) => { e.value = '24'; });
  await page.type('#input', 'Who built the ark?');
  await page.click('#send');
  await page.waitForFunction(() => document.getElementById('status').textContent === 'done', {timeout: 60000});
  const shown = await page.$eval('#log .assistant .reply', (e) => e.textContent);

  // the same request through the API, streamed
  const res = await fetch(url + '/v1/chat/completions', {method: 'POST',
    headers: {'Content-Type': 'application/json', Authorization: 'Bearer ' + key},
    body: JSON.stringify({messages: [{role: 'user', content: 'Who built the ark?'}], stream: true, max_tokens: 24,
                          reasoning_effort: 'none', seed: 11})});
  let text = '';
  for (const line of (await res.text()).split('\n'))
    if (line.startsWith('data: {')) text += JSON.parse(line.slice(6)).choices[0]?.delta?.content ?? '';
  assert.ok(text.length > 0, 'the API reply is empty');
  assert.equal(shown, text, 'the page shows the streamed reply');
  console.error('[serve_page] page reply:', JSON.stringify(shown));
} finally {
  await browser.close();
}
