// Runs one scripted kafkajs session against a broker and prints its results as JSON.
// Driven by tests/integration/test_kafkajs.py:
//   node kafkajs_ops.js '{"brokers": ["127.0.0.1:9092"], "steps": [{"op": "listTopics"}, ...]}'
// Binary keys, values and header values travel as base64 strings (null stays null).
'use strict';

const { Kafka, CompressionTypes, logLevel } = require('kafkajs');

const b64 = (s) => (s === null || s === undefined ? s : Buffer.from(s, 'base64'));

function toMessage(m) {
  const out = { key: b64(m.key), value: b64(m.value) };
  if (m.partition !== undefined) out.partition = m.partition;
  if (m.timestamp !== undefined) out.timestamp = String(m.timestamp);
  if (m.headers) {
    // [[name, base64], ...] -> {name: Buffer | [Buffer, ...]}, keeping repeats in order
    const headers = {};
    for (const [name, value] of m.headers) {
      const v = b64(value);
      if (name in headers) {
        headers[name] = [].concat(headers[name], [v]);
      } else {
        headers[name] = v;
      }
    }
    out.headers = headers;
  }
  return out;
}

function describeError(e) {
  const out = { error: true, name: e.name, type: e.type || null, message: e.message };
  if (Array.isArray(e.errors)) out.errors = e.errors.map(describeError);
  return out;
}

async function step(kafka, admin, s) {
  switch (s.op) {
    case 'createTopics':
      return await admin.createTopics({
        validateOnly: !!s.validateOnly,
        waitForLeaders: true,
        timeout: 10000,
        topics: s.topics.map((t) => ({
          topic: t.topic,
          numPartitions: t.numPartitions || 1,
          replicationFactor: 1,
          configEntries: Object.entries(t.configs || {}).map(([name, value]) => ({ name, value })),
        })),
      });
    case 'listTopics':
      return (await admin.listTopics()).sort();
    case 'fetchTopicMetadata': {
      const md = await admin.fetchTopicMetadata({ topics: s.topics });
      return md.topics.map((t) => ({
        name: t.name,
        partitions: t.partitions
          .map((p) => ({
            partitionId: p.partitionId,
            leader: p.leader,
            replicas: p.replicas,
            isr: p.isr,
            errorCode: p.partitionErrorCode,
          }))
          .sort((a, b) => a.partitionId - b.partitionId),
      }));
    }
    case 'fetchTopicOffsets': {
      // waitHigh {partition: offset}: records show once split, a moment after the ack
      const deadline = Date.now() + 10000;
      for (;;) {
        const offsets = await admin.fetchTopicOffsets(s.topic);
        const ready = Object.entries(s.waitHigh || {}).every(([p, high]) =>
          offsets.some((o) => o.partition === Number(p) && Number(o.high) >= high),
        );
        if (ready || Date.now() > deadline) return offsets;
        await new Promise((r) => setTimeout(r, 50));
      }
    }
    case 'fetchTopicOffsetsByTimestamp':
      return await admin.fetchTopicOffsetsByTimestamp(s.topic, s.timestamp);
    case 'describeCluster':
      return await admin.describeCluster();
    case 'deleteTopics':
      await admin.deleteTopics({ topics: s.topics, timeout: 10000 });
      return true;
    case 'produce': {
      const producer = kafka.producer({
        idempotent: !!s.idempotent,
        maxInFlightRequests: s.idempotent ? 1 : undefined,
        allowAutoTopicCreation: s.allowAutoTopicCreation !== false,
      });
      await producer.connect();
      try {
        const compression = s.compression === 'gzip' ? CompressionTypes.GZIP : CompressionTypes.None;
        const results = [];
        // one send per chunk, so several batches are written
        const chunk = s.chunk || s.messages.length;
        for (let i = 0; i < s.messages.length; i += chunk) {
          const res = await producer.send({
            topic: s.topic,
            acks: s.acks === undefined ? -1 : s.acks,
            timeout: 10000,
            compression,
            messages: s.messages.slice(i, i + chunk).map(toMessage),
          });
          results.push(...res);
        }
        return results;
      } finally {
        await producer.disconnect();
      }
    }
    default:
      throw new Error(`unknown op ${s.op}`);
  }
}

async function main() {
  const spec = JSON.parse(process.argv[2]);
  const kafka = new Kafka({
    clientId: 'stonemq-kafkajs-test',
    brokers: spec.brokers,
    connectionTimeout: 10000,
    requestTimeout: 15000,
    retry: { retries: 3, initialRetryTime: 100 },
    logLevel: logLevel.ERROR,
  });
  const admin = kafka.admin();
  await admin.connect();
  const results = [];
  try {
    for (const s of spec.steps) {
      try {
        results.push({ op: s.op, result: await step(kafka, admin, s) });
      } catch (e) {
        if (!s.expectError) throw e;
        results.push({ op: s.op, result: describeError(e) });
      }
    }
  } finally {
    await admin.disconnect();
  }
  process.stdout.write(JSON.stringify(results));
}

main().catch((e) => {
  process.stderr.write(`kafkajs_ops failed: ${e.stack || e}\n${JSON.stringify(describeError(e))}\n`);
  process.exit(1);
});
