// Kafka under a paced load: PUT->ACK and PUT->PUSH of every record, with
// Kafka's own Java client (the jars `taproot_ops/bench/kafka.py` fetches).
// Kafka's tools measure the first alone (ProducerPerformance) and the second
// only one record at a time (EndToEndLatency); this runs both at once.
//
//   java -cp 'JARS/*' PacedLatency.java BOOTSTRAP TOPIC RATE SECONDS SIZE WARMUP
//
// A consumer (assigned every partition of TOPIC, from the beginning) runs
// while a producer (acks=all, otherwise Kafka's defaults) sends RATE records a
// second for WARMUP + SECONDS, each stamped with System.nanoTime() in its
// first 8 bytes; both sides are in this JVM, so the clock is one. The first
// WARMUP seconds' records are sent, acknowledged and read but not measured
// (a cold JVM's first seconds on two cores took latencies past a second).
// Prints one JSON line: produce and consume msg/s, ack_ms and push_ms (p50,
// p99, max) of the measured records, the counts, and errors (a send that
// failed). Record i is the i-th read with one partition; with several, the
// i-th read stands for it.
import java.nio.ByteBuffer;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.LockSupport;

import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class PacedLatency {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], topic = args[1];
        double rate = Double.parseDouble(args[2]), seconds = Double.parseDouble(args[3]);
        int size = Integer.parseInt(args[4]);
        int warm = (int) Math.round(rate * Double.parseDouble(args[5]));
        int total = warm + (int) Math.round(rate * seconds);
        long[] ack = new long[total], push = new long[total];
        Arrays.fill(ack, -1);   // a send that failed keeps -1 and is left out of the percentiles
        AtomicLong acked = new AtomicLong(), errors = new AtomicLong();
        long[] received = {0}, firstLast = {0, 0};

        Properties c = new Properties();
        c.put("bootstrap.servers", bootstrap);
        c.put("enable.auto.commit", "false");
        KafkaConsumer<byte[], byte[]> consumer =
            new KafkaConsumer<>(c, new ByteArrayDeserializer(), new ByteArrayDeserializer());
        List<TopicPartition> partitions = new ArrayList<>();
        for (PartitionInfo p : consumer.partitionsFor(topic)) partitions.add(new TopicPartition(topic, p.partition()));
        consumer.assign(partitions);
        consumer.seekToBeginning(partitions);
        consumer.poll(Duration.ofMillis(100));   // connected and positioned before the first send

        Thread reader = new Thread(() -> {
            long deadline = Long.MAX_VALUE;
            while (received[0] < total && System.nanoTime() < deadline) {
                ConsumerRecords<byte[], byte[]> records = consumer.poll(Duration.ofMillis(100));
                long now = System.nanoTime();
                for (ConsumerRecord<byte[], byte[]> r : records) {
                    if (received[0] < total) push[(int) received[0]] = now - ByteBuffer.wrap(r.value()).getLong(0);
                    if (received[0] == warm) firstLast[0] = now;
                    received[0]++;
                    firstLast[1] = now;
                }
                if (deadline == Long.MAX_VALUE && acked.get() + errors.get() >= total)
                    deadline = now + 30_000_000_000L;   // everything acknowledged: 30 s more to read it
            }
        });
        reader.start();

        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("acks", "all");
        KafkaProducer<byte[], byte[]> producer =
            new KafkaProducer<>(p, new ByteArraySerializer(), new ByteArraySerializer());
        long begin = System.nanoTime(), start = 0, period = (long) (1e9 / rate);
        for (int i = 0; i < total; i++) {
            long due = begin + i * period, wait = due - System.nanoTime();
            if (i == warm) start = System.nanoTime();
            // Only once a millisecond ahead, as Kafka's ThroughputThrottler
            // and the Python drivers do, not before every record.
            if (wait >= 1_000_000L) LockSupport.parkNanos(wait);
            byte[] value = new byte[size];
            long sent = System.nanoTime();
            ByteBuffer.wrap(value).putLong(0, sent);
            final int n = i;
            producer.send(new ProducerRecord<>(topic, value), (meta, error) -> {
                if (error != null) errors.incrementAndGet();
                else ack[n] = System.nanoTime() - sent;
                acked.incrementAndGet();
            });
        }
        producer.flush();
        long produced = System.nanoTime();
        producer.close();
        reader.join();
        consumer.close();

        int got = (int) Math.min(received[0], total), measured = total - warm;
        double produceRate = measured / ((produced - start) / 1e9);
        double consumeRate = got > warm + 1 ? (got - warm) / ((firstLast[1] - firstLast[0]) / 1e9) : 0;
        System.out.println("{\"records\": " + total + ", \"measured\": " + measured
            + ", \"acked\": " + (acked.get() - errors.get())
            + ", \"errors\": " + errors.get() + ", \"received\": " + received[0]
            + ", \"produce_msg_s\": " + produceRate + ", \"consume_msg_s\": " + consumeRate
            + ", \"ack_ms\": " + percentiles(Arrays.stream(ack, warm, total).filter(x -> x >= 0).toArray())
            + ", \"push_ms\": " + percentiles(Arrays.copyOfRange(push, Math.min(warm, got), got)) + "}");
    }

    static String percentiles(long[] nanos) {
        if (nanos.length == 0) return "null";
        long[] sorted = nanos.clone();
        Arrays.sort(sorted);
        return "{\"p50\": " + at(sorted, 0.50) + ", \"p99\": " + at(sorted, 0.99) + ", \"max\": "
            + sorted[sorted.length - 1] / 1e6 + "}";
    }

    static double at(long[] sorted, double q) {
        return sorted[(int) Math.min(sorted.length - 1, Math.floor(q * sorted.length))] / 1e6;
    }
}
