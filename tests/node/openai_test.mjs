// The official openai client (pinned in package.json / package-lock.json) against isokv serve:
// models, completions and chat, plain and streamed, usage read back, an error status.
// usage: node openai_test.mjs BASE_URL API_KEY      (exit 0 when every check holds)
import OpenAI from 'openai';
import assert from 'node:assert/strict';

const [baseURL, apiKey] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60000 });

const models = await client.models.list();
const model = models.data[0].id;
assert.equal(model, 'stories260K');

const prompt = 'Once upon a time, there was a little girl who';
const c = await client.completions.create({ model, prompt, max_tokens: 10, temperature: 0 });
assert.equal(c.object, 'text_completion');
assert.ok(c.choices[0].text.length > 0);
assert.equal(c.usage.completion_tokens, 10);
assert.equal(c.usage.total_tokens, c.usage.prompt_tokens + 10);
assert.equal(typeof c.usage.prompt_tokens_details.cached_tokens, 'number');

let text = '';
let usage = null;
const s = await client.completions.create({
  model, prompt, max_tokens: 10, temperature: 0, stream: true,
  stream_options: { include_usage: true },
});
for await (const ch of s) {
  if (ch.choices && ch.choices[0]) text += ch.choices[0].text;
  if (ch.usage) usage = ch.usage;
}
assert.equal(text, c.choices[0].text); // greedy: the same text streamed
assert.equal(usage.completion_tokens, 10);
// the same prompt again: every position but the last comes from the cache
assert.equal(usage.prompt_tokens_details.cached_tokens, usage.prompt_tokens - 1);

const messages = [
  { role: 'system', content: 'You tell stories.' },
  { role: 'user', content: 'Tell me about a cat.' },
];
const chat = await client.chat.completions.create({ model, messages, max_tokens: 8, temperature: 0 });
assert.equal(chat.object, 'chat.completion');
assert.equal(chat.choices[0].message.role, 'assistant');
assert.equal(chat.usage.completion_tokens, 8);

let ctext = '';
let cusage = null;
const cs = await client.chat.completions.create({
  model, messages, max_tokens: 8, temperature: 0, stream: true,
  stream_options: { include_usage: true },
});
for await (const ch of cs) {
  if (ch.choices && ch.choices[0] && ch.choices[0].delta.content) ctext += ch.choices[0].delta.content;
  if (ch.usage) cusage = ch.usage;
}
assert.equal(ctext, chat.choices[0].message.content);
assert.ok(cusage.prompt_tokens_details.cached_tokens > 0);
assert.ok(cusage.isokv.ttft_ms > 0);

// chat messages as segments (isokv extension, passed through by the client): a document
// message flagged reusable is stored by the first request and reused behind another history
const doc = {
  role: 'user', content: 'Lily went to the park with her mom. She saw a big red ball under a tree.',
  isokv: { kind: 'doc', reusable: true, public: true },
};
const q = { role: 'user', content: 'What did Lily see?' };
const seg1 = await client.chat.completions.create({
  model, messages: [messages[0], doc, q], max_tokens: 6, temperature: 0,
  isokv: { blend_ratio: 0.2 },
});
assert.equal(seg1.object, 'chat.completion');
assert.equal(seg1.usage.isokv.chunk_hits, 0);
assert.ok(seg1.usage.isokv.reusable_tokens > 10);
const seg2 = await client.chat.completions.create({
  model, messages: [messages[0], { role: 'user', content: 'I like cats.' }, doc, q],
  max_tokens: 6, temperature: 0, isokv: { blend_ratio: 0.2 },
});
assert.equal(seg2.usage.isokv.chunk_hits, 1);
assert.equal(seg2.usage.isokv.blended, true);
assert.ok(seg2.usage.isokv.reused_tokens > 0);
assert.ok(seg2.usage.prompt_tokens_details.cached_tokens >= seg2.usage.isokv.reused_tokens);

const bad = new OpenAI({ baseURL, apiKey: 'wrong-key', maxRetries: 0 });
await assert.rejects(bad.completions.create({ model, prompt: 'x', max_tokens: 1 }),
  (e) => e.status === 401 && e instanceof OpenAI.AuthenticationError);
await assert.rejects(client.completions.create({ model, prompt: 'x', max_tokens: 1, n: 3 }),
  (e) => e.status === 400 && e.param === 'n');
console.log('openai client: models, completions, chat, chat segments, streaming, usage, errors: ok');
