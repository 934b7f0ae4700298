/* SPDX-License-Identifier: MIT */
/*
 * TimerBench - the Java peers of twheel's service benchmark (bench_service):
 * Netty's HashedWheelTimer (Debian's libnetty-java) and the JDK's
 * ScheduledThreadPoolExecutor, measured the same way:
 *
 *   - schedule calls per second into a fresh timer, cancel calls per second
 *     on those pending tasks, and schedule + immediate cancel pairs per
 *     second, from 1 and from 2 producer threads, N tasks with delays
 *     uniform in [1 s, 60 s] (fixed seed);
 *   - bytes of Java heap per pending task (N tasks 1-2 h away);
 *   - timer-thread wake-ups per second with nothing pending (voluntary
 *     context switches of the worker thread, from /proc).
 *
 * Netty runs with a 1 ms tick and 512 buckets for the throughput figures
 * (the twheel service's tick), and with 1 ms and 100 ms (Netty's default) for
 * the idle figure. The executor uses setRemoveOnCancelPolicy(true) so that a
 * cancelled task leaves its queue at once, as in the service.
 *
 * One warm-up run, then R runs; prints median and best, and appends CSV rows
 * (n,workload,engine,unit,median,min,max,reps,speedup_vs_heap,
 * fired_fraction,note) to the --csv file.
 *
 * Usage: java -cp netty-common.jar:. TimerBench [--tasks N] [--reps R]
 *        [--idle-ms MS] [--csv FILE] [--threads 1,2,4] [--netty-only 1]
 *
 * --threads: the producer counts (default 1,2); --netty-only 1: only
 * Netty's throughput rows (for a side-by-side run with bench_service
 * --throughput).
 */
import io.netty.util.HashedWheelTimer;
import io.netty.util.Timeout;
import io.netty.util.TimerTask;

import java.io.FileWriter;
import java.io.IOException;
import java.io.PrintWriter;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.CyclicBarrier;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.ThreadFactory;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;

public final class TimerBench {
    /** One timer implementation, seen from the producers. */
    interface Engine {
        Object schedule(long delayNs);

        boolean cancel(Object handle);

        /** Wait until the timer thread has taken in what was scheduled. */
        void settle() throws InterruptedException;

        void close();
    }

    static final TimerTask NETTY_TASK = t -> { };
    static final Runnable JDK_TASK = () -> { };
    static final AtomicInteger THREAD_SEQ = new AtomicInteger();
    /** Cancels that found the task already run (a run slower than 1 s). */
    static final AtomicLong lateCancels = new AtomicLong();

    /** A factory naming the timer thread so that /proc can find it. */
    static final class Named implements ThreadFactory {
        final String name = "twb-w" + THREAD_SEQ.incrementAndGet();

        @Override
        public Thread newThread(Runnable r) {
            Thread t = new Thread(r, name);
            t.setDaemon(true);
            return t;
        }
    }

    static final class Netty implements Engine {
        final Named tf = new Named();
        final HashedWheelTimer timer;
        final long tickMs;

        Netty(long tickMs) {
            this.tickMs = tickMs;
            timer = new HashedWheelTimer(tf, tickMs, TimeUnit.MILLISECONDS, 512);
            timer.start();
        }

        @Override
        public Object schedule(long delayNs) {
            return timer.newTimeout(NETTY_TASK, delayNs, TimeUnit.NANOSECONDS);
        }

        @Override
        public boolean cancel(Object h) {
            return ((Timeout) h).cancel();
        }

        @Override
        public void settle() throws InterruptedException {
            /* The worker moves at most 100,000 new timeouts per tick. */
            Thread.sleep(tickMs * 4 + 50);
        }

        @Override
        public void close() {
            timer.stop();
        }
    }

    static final class Stpe implements Engine {
        final Named tf = new Named();
        final ScheduledThreadPoolExecutor ex;

        Stpe() {
            ex = new ScheduledThreadPoolExecutor(1, tf);
            ex.setRemoveOnCancelPolicy(true);
            ex.prestartAllCoreThreads();
        }

        @Override
        public Object schedule(long delayNs) {
            return ex.schedule(JDK_TASK, delayNs, TimeUnit.NANOSECONDS);
        }

        @Override
        public boolean cancel(Object h) {
            return ((ScheduledFuture<?>) h).cancel(false);
        }

        @Override
        public void settle() {
        }

        @Override
        public void close() {
            ex.shutdownNow();
        }
    }

    interface Factory {
        Engine make();
    }

    enum Op { SCHEDULE, CANCEL, PAIRS }

    /** Runs @op on @threads threads over all tasks; returns operations/s. */
    static double runOp(Engine e, Op op, int threads, long[] delays,
                        Object[] ids) throws Exception {
        int per = delays.length / threads;
        CyclicBarrier start = new CyclicBarrier(threads);
        long[] t0 = new long[threads], t1 = new long[threads];
        Thread[] th = new Thread[threads];
        for (int k = 0; k < threads; k++) {
            final int kk = k, lo = k * per, hi = lo + per;
            th[k] = new Thread(() -> {
                try {
                    start.await();
                } catch (Exception ex) {
                    throw new RuntimeException(ex);
                }
                t0[kk] = System.nanoTime();
                switch (op) {
                case SCHEDULE:
                    for (int i = lo; i < hi; i++)
                        ids[i] = e.schedule(delays[i]);
                    break;
                case CANCEL:
                    for (int i = lo; i < hi; i++)
                        if (!e.cancel(ids[i]))
                            lateCancels.incrementAndGet();
                    break;
                case PAIRS:
                    for (int i = lo; i < hi; i++)
                        if (!e.cancel(e.schedule(delays[i])))
                            lateCancels.incrementAndGet();
                    break;
                }
                t1[kk] = System.nanoTime();
            });
            th[k].start();
        }
        for (Thread t : th)
            t.join();
        long a = Long.MAX_VALUE, b = 0;
        for (int k = 0; k < threads; k++) {
            a = Math.min(a, t0[k]);
            b = Math.max(b, t1[k]);
        }
        return (double) per * threads / ((b - a) / 1e9);
    }

    /** Voluntary context switches of the named thread, or -1. */
    static long switches(String name) throws IOException {
        try (var tasks = Files.list(Paths.get("/proc/self/task"))) {
            for (Path p : (Iterable<Path>) tasks::iterator) {
                String comm = Files.readString(p.resolve("comm")).trim();
                if (!comm.equals(name))
                    continue;
                for (String line : Files.readAllLines(p.resolve("status")))
                    if (line.startsWith("voluntary_ctxt_switches:"))
                        return Long.parseLong(line.split("\\s+")[1]);
            }
        }
        return -1;
    }

    static double idleWakeups(Engine e, String thread, long windowMs)
            throws Exception {
        Thread.sleep(200); /* let the start-up settle */
        long s0 = switches(thread), t0 = System.nanoTime();
        Thread.sleep(windowMs);
        long s1 = switches(thread), t1 = System.nanoTime();
        if (s0 < 0 || s1 < 0)
            return Double.NaN;
        return (s1 - s0) / ((t1 - t0) / 1e9);
    }

    static long usedHeap() throws InterruptedException {
        Runtime rt = Runtime.getRuntime();
        for (int i = 0; i < 4; i++) {
            System.gc();
            Thread.sleep(50);
        }
        return rt.totalMemory() - rt.freeMemory();
    }

    static double median(double[] v) {
        double[] s = v.clone();
        Arrays.sort(s);
        int n = s.length;
        return n % 2 == 1 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
    }

    static PrintWriter csv;
    static int tasks;
    static int[] producerCounts = {1, 2};
    static boolean nettyOnly;

    static void row(String workload, String engine, String unit, double[] v,
                    String note) {
        double[] s = v.clone();
        Arrays.sort(s);
        double med = median(s);
        System.out.printf("%-28s %-18s %10.3f %10.3f %-10s %s%n", workload,
                          engine, med, s[s.length - 1], unit, note);
        if (csv != null)
            csv.printf("%d,%s,%s,%s,%.4f,%.4f,%.4f,%d,,,%s%n", tasks, workload,
                       engine, unit, med, s[0], s[s.length - 1], s.length,
                       note);
    }

    static void throughput(String name, Factory f, long[] delays, int reps)
            throws Exception {
        Object[] ids = new Object[delays.length];
        for (int threads : producerCounts) {
            double[] sch = new double[reps], can = new double[reps],
                     pairs = new double[reps];
            for (int r = -1; r < reps; r++) { /* -1: warm-up */
                Engine e = f.make();
                double a = runOp(e, Op.SCHEDULE, threads, delays, ids);
                double b = runOp(e, Op.CANCEL, threads, delays, ids);
                Arrays.fill(ids, null);
                e.settle();
                double c = runOp(e, Op.PAIRS, threads, delays, ids);
                e.close();
                if (r >= 0) {
                    sch[r] = a / 1e6;
                    can[r] = b / 1e6;
                    pairs[r] = c / 1e6;
                }
            }
            String p = "_" + threads + "p";
            row("svc_schedule" + p, name, "Mops/s", sch, "fresh timer");
            row("svc_cancel" + p, name, "Mops/s", can, "");
            row("svc_pairs" + p, name, "Mops/s", pairs, "schedule+cancel");
        }
    }

    static void memory(String name, Factory f, long[] delays) throws Exception {
        Object[] ids = new Object[delays.length];
        long u0 = usedHeap();
        Engine e = f.make();
        for (int i = 0; i < delays.length; i++)
            ids[i] = e.schedule(delays[i] + 3_600_000_000_000L);
        e.settle();
        Thread.sleep(100);
        long u1 = usedHeap();
        row("svc_bytes_per_task", name, "B/task",
            new double[] {(double) (u1 - u0) / delays.length},
            "Java heap growth with N tasks pending");
        e.close();
        Arrays.fill(ids, null);
    }

    public static void main(String[] args) throws Exception {
        int reps = 5;
        long idleMs = 2000;
        tasks = 1_000_000;
        for (int i = 0; i < args.length; i++) {
            String a = args[i], v = i + 1 < args.length ? args[i + 1] : null;
            if (v == null)
                usage();
            i++;
            switch (a) {
            case "--tasks": tasks = Integer.parseInt(v); break;
            case "--reps": reps = Integer.parseInt(v); break;
            case "--idle-ms": idleMs = Long.parseLong(v); break;
            case "--csv": csv = new PrintWriter(new FileWriter(v, true)); break;
            case "--threads":
                producerCounts = Arrays.stream(v.split(","))
                                     .mapToInt(Integer::parseInt).toArray();
                break;
            case "--netty-only": nettyOnly = !v.equals("0"); break;
            default: usage();
            }
        }
        tasks &= ~1;
        long[] delays = new long[tasks];
        long s = 1;
        for (int i = 0; i < tasks; i++) {
            s += 0x9E3779B97F4A7C15L;
            long z = s;
            z = (z ^ (z >>> 30)) * 0xBF58476D1CE4E5B9L;
            z = (z ^ (z >>> 27)) * 0x94D049BB133111EBL;
            z ^= z >>> 31;
            delays[i] = 1_000_000_000L + Long.remainderUnsigned(z, 59_000_000_000L);
        }
        System.out.printf("Java peers: %d tasks, delays uniform in [1 s, 60 s], "
                          + "warm-up + %d runs; median and best%n", tasks, reps);
        System.out.printf("%-28s %-18s %10s %10s%n", "metric", "engine",
                          "median", "best");
        List<Object[]> engines = new ArrayList<>();
        engines.add(new Object[] {"netty-hwt", (Factory) () -> new Netty(1)});
        engines.add(new Object[] {"jdk-stpe", (Factory) Stpe::new});
        if (nettyOnly) {
            throughput("netty-hwt", (Factory) () -> new Netty(1), delays, reps);
            return;
        }
        for (Object[] en : engines)
            throughput((String) en[0], (Factory) en[1], delays, reps);
        for (Object[] en : engines)
            memory((String) en[0], (Factory) en[1], delays);

        Netty n1 = new Netty(1);
        row("svc_idle_wakeups", "netty-hwt-1ms", "wakeups/s",
            new double[] {idleWakeups(n1, n1.tf.name, idleMs)},
            "nothing pending");
        n1.close();
        Netty n100 = new Netty(100);
        row("svc_idle_wakeups", "netty-hwt-100ms", "wakeups/s",
            new double[] {idleWakeups(n100, n100.tf.name, idleMs)},
            "nothing pending");
        n100.close();
        Stpe st = new Stpe();
        row("svc_idle_wakeups", "jdk-stpe", "wakeups/s",
            new double[] {idleWakeups(st, st.tf.name, idleMs)},
            "nothing pending");
        st.close();
        if (lateCancels.get() != 0)
            System.out.printf("note: %d cancels found their task already run "
                              + "(a run took over 1 s)%n", lateCancels.get());
        if (csv != null)
            csv.close();
    }

    static void usage() {
        System.err.println("usage: TimerBench [--tasks N] [--reps R] "
                           + "[--idle-ms MS] [--csv FILE] [--threads 1,2,4] "
                           + "[--netty-only 1]");
        System.exit(2);
    }
}
