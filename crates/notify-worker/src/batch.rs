//! Coalesces concurrent database calls of one kind into one statement or transaction.
//!
//! The runtime handles each message in its own task; claims and records from concurrent
//! tasks meet here. A loop takes every call waiting (up to a limit), runs them as one
//! batch and answers each caller. Under light load a batch is one call and adds no wait.
//! A batch that fails for a reason other than the database being unreachable is run again
//! one call at a time, so one bad call fails alone and does not take the others with it.

use notify_store::{Result, StoreError};
use std::future::Future;
use std::sync::Arc;
use tokio::sync::{Mutex, mpsc, oneshot};

type Call<I, O> = (I, oneshot::Sender<Result<O, (String, bool)>>);

/// Handle to the batching loops; cheap to clone. The loops stop when every handle is gone.
pub struct Batcher<I, O> {
    tx: mpsc::Sender<Call<I, O>>,
}

impl<I, O> Clone for Batcher<I, O> {
    fn clone(&self) -> Self {
        Self {
            tx: self.tx.clone(),
        }
    }
}

impl<I: Clone + Send + 'static, O: Send + 'static> Batcher<I, O> {
    /// Starts `loops` loops (batches in flight at once), each running `f` on up to `max`
    /// calls. `f` returns one output per input, in order.
    pub fn start<F, Fut>(loops: usize, max: usize, f: F) -> Self
    where
        F: Fn(Vec<I>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<O>>> + Send + 'static,
    {
        let (tx, rx) = mpsc::channel::<Call<I, O>>(max * loops.max(1) * 2);
        let rx = Arc::new(Mutex::new(rx));
        let f = Arc::new(f);
        for _ in 0..loops.max(1) {
            let (rx, f) = (rx.clone(), f.clone());
            tokio::spawn(async move {
                loop {
                    let mut calls = Vec::new();
                    {
                        let mut rx = rx.lock().await;
                        match rx.recv().await {
                            Some(c) => calls.push(c),
                            None => return,
                        }
                        while calls.len() < max {
                            match rx.try_recv() {
                                Ok(c) => calls.push(c),
                                Err(_) => break,
                            }
                        }
                    }
                    let (inputs, replies): (Vec<I>, Vec<_>) = calls.into_iter().unzip();
                    let alone = inputs.len() > 1;
                    match f(inputs.clone()).await {
                        Ok(outputs) if outputs.len() == replies.len() => {
                            for (reply, out) in replies.into_iter().zip(outputs) {
                                let _ = reply.send(Ok(out));
                            }
                        }
                        Ok(_) => {
                            for reply in replies {
                                let _ =
                                    reply.send(Err(("batch returned a wrong count".into(), false)));
                            }
                        }
                        Err(e) if alone && !e.is_transient() => {
                            // One call refused by the database fails alone.
                            for (input, reply) in inputs.into_iter().zip(replies) {
                                let out = match f(vec![input]).await {
                                    Ok(mut out) if out.len() == 1 => Ok(out.remove(0)),
                                    Ok(_) => Err(("batch returned a wrong count".into(), false)),
                                    Err(e) => Err((e.to_string(), e.is_transient())),
                                };
                                let _ = reply.send(out);
                            }
                        }
                        Err(e) => {
                            let (msg, transient) = (e.to_string(), e.is_transient());
                            for reply in replies {
                                let _ = reply.send(Err((msg.clone(), transient)));
                            }
                        }
                    }
                }
            });
        }
        Self { tx }
    }

    /// Runs `item` in the next batch and returns its output.
    ///
    /// # Errors
    /// [`StoreError::Batch`] with the batch's (or, after a refused batch, this call's own)
    /// database error as text and whether it is transient, or `PoolClosed` once the loops
    /// stopped.
    pub async fn call(&self, item: I) -> Result<O> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send((item, reply))
            .await
            .map_err(|_| StoreError::Db(sqlx_closed()))?;
        match answer.await {
            Ok(Ok(out)) => Ok(out),
            Ok(Err((message, transient))) => Err(StoreError::Batch { message, transient }),
            Err(_) => Err(StoreError::Db(sqlx_closed())),
        }
    }
}

fn sqlx_closed() -> notify_store::sqlx::Error {
    notify_store::sqlx::Error::PoolClosed
}
