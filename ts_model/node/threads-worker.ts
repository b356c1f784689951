// A worker of ./threads.ts: runs model.ts's kernel over the columns it is given, into the shared output,
// then sets its slot of `done` to 1 (2 if the kernel threw) and wakes the waiting thread.

import { parentPort } from "node:worker_threads";

import { PRODUCT_KERNELS } from "../model/model.ts";
import type { Job } from "./threads.ts";

parentPort?.on("message", (job: Job) => {
  let status = 1;
  try {
    PRODUCT_KERNELS[job.kind](job.xd, job.wd, job.od, job.T, job.n, job.m, job.j0, job.j1);
  } catch {
    status = 2;
  }
  Atomics.store(job.done, job.slot, status);
  Atomics.notify(job.done, job.slot);
});
