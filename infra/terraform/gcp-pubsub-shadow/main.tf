# A second subscription on the topic the existing system consumes, for a fencebridge shadow
# subscription (mode = "shadow"): every message published to the topic is delivered to both
# subscriptions, so the bridge records a copy while the existing consumer keeps its own. The
# gcp-pubsub module on an existing topic: the subscription (exactly-once, retry policy,
# dead-letter topic) and a service account that may consume it and nothing else.

module "shadow" {
  source = "../gcp-pubsub"

  project_id                 = var.project_id
  name                       = "${var.name}-shadow"
  create_topic               = false
  topic_id                   = var.topic_id
  message_retention_duration = var.message_retention_duration
  service_account_id         = var.service_account_id
  kubernetes_service_account = var.kubernetes_service_account
  labels                     = var.labels
}
