// A kafkajs producer (acks=-1) and group consumer for tests/integration/test_failover_clients.py:
//   node kafkajs_failover.js '{"brokers": [...], "topic": "t", "groupId": "g", "stopFile": "/path"}'
// Both run with kafkajs' defaults. The producer sends one value at a time until `stopFile`
// exists; every outcome is a line on stdout: "acked <offset> <value>" or "failed <value> <error>".
// The consumer prints "consumed <offset> <value>" for each record. After the stop file, the
// script runs until every acknowledged value was consumed (or `timeoutMs`), then prints "done".
'use strict';

const fs = require('fs');
const { Kafka, logLevel } = require('kafkajs');

function out(line) {
  process.stdout.write(line + '\n');
}

async function main() {
  const spec = JSON.parse(process.argv[2]);
  const kafka = new Kafka({ clientId: 'kafkajs-failover', brokers: spec.brokers, logLevel: logLevel.NOTHING });
  const producer = kafka.producer();
  const consumer = kafka.consumer({ groupId: spec.groupId });
  // lifecycle events, one "event <time> <name> <detail>" line each, for a failure's message
  const t0 = Date.now();
  const event = (name, detail) => out(`event ${((Date.now() - t0) / 1000).toFixed(1)}s ${name} ${detail || ''}`);
  const e = consumer.events;
  consumer.on(e.GROUP_JOIN, (ev) => event('group_join', JSON.stringify(ev.payload.memberAssignment)));
  consumer.on(e.CRASH, (ev) => event('consumer_crash', String(ev.payload.error)));
  consumer.on(e.REBALANCING, () => event('rebalancing'));
  consumer.on(e.STOP, () => event('consumer_stop'));
  await producer.connect();
  await consumer.connect();
  await consumer.subscribe({ topic: spec.topic, fromBeginning: true });
  const acked = new Set();
  const consumed = new Set();
  await consumer.run({
    eachMessage: async ({ message }) => {
      const value = message.value.toString();
      consumed.add(value);
      out(`consumed ${message.offset} ${value}`);
    },
  });
  let i = 0;
  while (!fs.existsSync(spec.stopFile)) {
    const value = `js${String(i).padStart(6, '0')}`;
    i += 1;
    try {
      const [meta] = await producer.send({ topic: spec.topic, acks: -1, messages: [{ value }] });
      acked.add(value);
      out(`acked ${meta.baseOffset} ${value}`);
    } catch (e) {
      out(`failed ${value} ${String(e && e.name)}:${String(e && e.message).replace(/\s+/g, ' ')}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
  event('stop_file');
  const deadline = Date.now() + (spec.timeoutMs || 60000);
  while (Date.now() < deadline && [...acked].some((v) => !consumed.has(v))) {
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  event('consumed_wait_over', `${[...acked].filter((v) => !consumed.has(v)).length} unconsumed`);
  await producer.disconnect();
  event('producer_disconnected');
  await consumer.disconnect();
  event('consumer_disconnected');
  out('done');
}

main().catch((e) => {
  process.stderr.write(String(e && e.stack ? e.stack : e));
  process.exit(1);
});
