//! CloudWatch `PutMetricData`, at most 1000 data points per request, never NaN or ±Inf.

use async_trait::async_trait;
use aws_sdk_cloudwatch::types::{Dimension, MetricDatum, StandardUnit};

use super::{group_values, Datum, Sink};
use crate::error::{DispatchError, ErrorClass, Result};

pub struct CloudWatchSink {
    client: aws_sdk_cloudwatch::Client,
    namespace: String,
}

impl CloudWatchSink {
    pub fn new(client: aws_sdk_cloudwatch::Client, namespace: impl Into<String>) -> Self {
        Self {
            client,
            namespace: namespace.into(),
        }
    }
}

fn to_cloudwatch(datum: &Datum, values: Vec<f64>) -> MetricDatum {
    let dimensions = datum
        .dimensions
        .iter()
        .map(|(name, value)| Dimension::builder().name(*name).value(*value).build())
        .collect();
    MetricDatum::builder()
        .metric_name(datum.name)
        .unit(StandardUnit::from(datum.unit))
        .set_dimensions(Some(dimensions))
        .set_values(Some(values))
        .build()
}

#[async_trait]
impl Sink for CloudWatchSink {
    async fn publish(&self, datums: Vec<Datum>) -> Result<()> {
        let grouped = group_values(datums);
        for chunk in grouped.chunks(1000) {
            let data = chunk
                .iter()
                .map(|(datum, values)| to_cloudwatch(datum, values.clone()))
                .collect();
            self.client
                .put_metric_data()
                .namespace(&self.namespace)
                .set_metric_data(Some(data))
                .send()
                .await
                .map_err(|e| DispatchError::Queue {
                    op: "PutMetricData",
                    class: ErrorClass::Transient,
                    message: format!("{e:?}").chars().take(300).collect(),
                })?;
        }
        Ok(())
    }
}
