// A kafkajs group consumer for tests/integration/test_groups.py:
//   node kafkajs_groups.js '{"brokers": ["127.0.0.1:9092"], "topic": "t", "groupId": "g", "expect": 60}'
// Subscribes from the beginning, commits each message's next offset, stops after `expect`
// messages and prints {"count": n, "records": [[partition, offset, value], ...]} as JSON.
'use strict';

const { Kafka, logLevel } = require('kafkajs');

async function main() {
  const spec = JSON.parse(process.argv[2]);
  const kafka = new Kafka({ clientId: 'kafkajs-groups', brokers: spec.brokers, logLevel: logLevel.NOTHING });
  const consumer = kafka.consumer({ groupId: spec.groupId, sessionTimeout: 10000, heartbeatInterval: 500 });
  await consumer.connect();
  await consumer.subscribe({ topic: spec.topic, fromBeginning: true });
  const records = [];
  let finish;
  const done = new Promise((resolve) => { finish = resolve; });
  await consumer.run({
    autoCommit: false,
    eachMessage: async ({ topic, partition, message }) => {
      records.push([partition, Number(message.offset), message.value.toString()]);
      const next = (BigInt(message.offset) + 1n).toString();
      await consumer.commitOffsets([{ topic, partition, offset: next }]);
      if (records.length >= spec.expect) finish();
    },
  });
  const timer = setTimeout(finish, spec.timeoutMs || 40000);
  await done;
  clearTimeout(timer);
  await consumer.disconnect();
  process.stdout.write(JSON.stringify({ count: records.length, records }));
}

main().catch((e) => {
  process.stderr.write(String(e && e.stack ? e.stack : e));
  process.exit(1);
});
