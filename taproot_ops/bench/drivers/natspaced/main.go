// natspaced: NATS JetStream under a paced load, PUT->ACK and PUT->PUSH of
// every message, with NATS's own Go client (nats.go's jetstream package).
// `nats bench` measures publish acknowledgements but has no end-to-end
// latency; this runs both at once.
//
//	natspaced -s URL -stream NAME -rate 10000 -seconds 20 -size 1024 -warmup 5
//
// It creates a file-backed stream (subject NAME.x, one replica) and a durable
// pull consumer with explicit acks, consuming, then publishes asynchronously
// RATE messages a second for WARMUP + SECONDS (at most -inflight waiting for
// their acknowledgement), each stamped with its send time in its first 8
// bytes. The publisher and the consumer are in this process, so the clock is
// one. The first WARMUP seconds' messages are sent, acknowledged and read but
// not measured. Prints one JSON line: produce and consume msg/s, ack_ms and
// push_ms (p50, p99, max) of the measured messages, and the counts.
package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

type latencies struct {
	sync.Mutex
	ms []float64
}

func (l *latencies) add(ms float64) {
	l.Lock()
	l.ms = append(l.ms, ms)
	l.Unlock()
}

func (l *latencies) percentiles() map[string]float64 {
	l.Lock()
	defer l.Unlock()
	if len(l.ms) == 0 {
		return nil
	}
	sort.Float64s(l.ms)
	at := func(q float64) float64 {
		return l.ms[int(math.Min(float64(len(l.ms)-1), math.Floor(q*float64(len(l.ms)))))]
	}
	return map[string]float64{"p50": at(0.50), "p99": at(0.99), "max": l.ms[len(l.ms)-1]}
}

func main() {
	url := flag.String("s", nats.DefaultURL, "server URL")
	stream := flag.String("stream", "paced", "stream to create")
	rate := flag.Float64("rate", 10000, "messages a second")
	seconds := flag.Float64("seconds", 20, "measured seconds")
	warmup := flag.Float64("warmup", 5, "seconds sent before the measured ones")
	size := flag.Int("size", 1024, "message bytes (at least 16: the send time and the message's number)")
	inflight := flag.Int("inflight", 500, "asynchronous publishes waiting for their acknowledgement, at most")
	flag.Parse()
	if *size < 16 || *rate <= 0 || *seconds <= 0 || *warmup < 0 || *inflight < 1 {
		fmt.Fprintln(os.Stderr, "natspaced: -size >= 16, -rate > 0, -seconds > 0, -warmup >= 0 and -inflight >= 1 are required")
		os.Exit(2)
	}
	if err := run(*url, *stream, *rate, *seconds, *warmup, *size, *inflight); err != nil {
		fmt.Fprintln(os.Stderr, "natspaced:", err)
		os.Exit(1)
	}
}

const minSleepNs = int64(time.Millisecond)

func run(url, stream string, rate, seconds, warmup float64, size, inflight int) error {
	warm := int64(math.Round(rate * warmup))
	total := warm + int64(math.Round(rate*seconds))
	origin := time.Now()
	since := func() int64 { return int64(time.Since(origin)) } // monotonic nanoseconds
	ack, push := &latencies{}, &latencies{}
	var acked, failed int64
	var mu sync.Mutex
	measured := func(data []byte) bool { return int64(binary.LittleEndian.Uint64(data[8:16])) >= warm }

	nc, err := nats.Connect(url)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(inflight),
		jetstream.WithPublishAsyncAckHandler(func(_ jetstream.JetStream, m *nats.Msg, _ *jetstream.PubAck) {
			if measured(m.Data) {
				ack.add(float64(since()-int64(binary.LittleEndian.Uint64(m.Data))) / 1e6)
			}
			mu.Lock()
			acked++
			mu.Unlock()
		}),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, _ *nats.Msg, _ error) {
			mu.Lock()
			failed++
			mu.Unlock()
		}))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{stream + ".x"},
		Storage: jetstream.FileStorage, Replicas: 1}); err != nil {
		return err
	}
	consumer, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "paced",
		AckPolicy: jetstream.AckExplicitPolicy, DeliverPolicy: jetstream.DeliverAllPolicy})
	if err != nil {
		return err
	}
	var received int64
	var first, last int64
	done := make(chan struct{})
	consuming, err := consumer.Consume(func(m jetstream.Msg) {
		now := since()
		data := m.Data()
		if measured(data) {
			push.add(float64(now-int64(binary.LittleEndian.Uint64(data))) / 1e6)
		}
		_ = m.Ack()
		mu.Lock()
		received++
		if received == warm+1 {
			first = now
		}
		last = now
		if received == total {
			close(done)
		}
		mu.Unlock()
	})
	if err != nil {
		return err
	}
	defer consuming.Stop()

	period := 1e9 / rate
	begin := since()
	var start int64
	for i := int64(0); i < total; i++ {
		// Sleep only once a millisecond ahead, as the Python drivers and
		// Kafka's ThroughputThrottler do, not before every message.
		if wait := begin + int64(float64(i)*period) - since(); wait >= minSleepNs {
			time.Sleep(time.Duration(wait))
		}
		if i == warm {
			start = since()
		}
		data := make([]byte, size)
		binary.LittleEndian.PutUint64(data[0:8], uint64(since()))
		binary.LittleEndian.PutUint64(data[8:16], uint64(i))
		// At -inflight unacknowledged the publish waits (up to a minute) for room:
		// a server that cannot keep the pace slows the publisher, as it would a client.
		if _, err := js.PublishAsync(stream+".x", data, jetstream.WithStallWait(time.Minute)); err != nil {
			return err
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(60 * time.Second):
		return fmt.Errorf("publishes not acknowledged after 60 s")
	}
	produced := since()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
	}
	mu.Lock()
	defer mu.Unlock()
	consumeRate := 0.0
	if last > first {
		consumeRate = float64(received-warm) / (float64(last-first) / 1e9)
	}
	out, _ := json.Marshal(map[string]any{
		"records": total, "measured": total - warm, "acked": acked, "errors": failed, "received": received,
		"produce_msg_s": float64(total-warm) / (float64(produced-start) / 1e9), "consume_msg_s": consumeRate,
		"ack_ms": ack.percentiles(), "push_ms": push.percentiles()})
	fmt.Println(string(out))
	return nil
}
