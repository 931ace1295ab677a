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
  const deadline = Date.now() + (spec.timeoutMs || 60000);
  while (Date.now() < deadline && [...acked].some((v) => !consumed.has(v))) {
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  await producer.disconnect();
  await consumer.disconnect();
  out('done');
}

main().catch((e) => {
  process.stderr.write(String(e && e.stack ? e.stack : e));
  process.exit(1);
});
