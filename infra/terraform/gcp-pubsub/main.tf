# A Pub/Sub topic and the subscription fencebridge consumes, with exactly-once delivery, a retry
# policy and a dead-letter topic, plus a service account that may consume that subscription and
# nothing else.

data "google_project" "this" {
  project_id = var.project_id
}

locals {
  topic_id = var.create_topic ? google_pubsub_topic.this[0].id : var.topic_id
  # The Pub/Sub service agent forwards undeliverable messages to the dead-letter topic.
  pubsub_service_agent = "serviceAccount:service-${data.google_project.this.number}@gcp-sa-pubsub.iam.gserviceaccount.com"
  # Service account ids are 6-30 characters of [a-z0-9-], starting with a letter.
  default_account_id = trim(substr("fb-${replace(lower(var.name), "/[^a-z0-9-]/", "-")}", 0, 30), "-")
}

resource "google_pubsub_topic" "this" {
  count = var.create_topic ? 1 : 0

  project = var.project_id
  name    = var.name
  labels  = var.labels
}

resource "google_pubsub_topic" "dead_letter" {
  project = var.project_id
  name    = "${var.name}-dead-letter"
  labels  = var.labels
}

# A topic without a subscription drops what is published to it: this one keeps dead letters
# (for the longest retention Pub/Sub allows) until a person has looked at them.
resource "google_pubsub_subscription" "dead_letter" {
  project                    = var.project_id
  name                       = "${var.name}-dead-letter"
  topic                      = google_pubsub_topic.dead_letter.id
  message_retention_duration = "604800s"
  ack_deadline_seconds       = 60
  labels                     = var.labels

  expiration_policy {
    ttl = ""
  }
}

resource "google_pubsub_subscription" "bridge" {
  project = var.project_id
  name    = "${var.name}-fencebridge"
  topic   = local.topic_id
  labels  = var.labels

  # With exactly-once delivery an acknowledged message is not redelivered and an ack id that
  # expired is refused, so the bridge learns when an ack did not take. Duplicates still arrive
  # from producers that publish twice: the work row's key is what makes them harmless.
  enable_exactly_once_delivery = true
  enable_message_ordering      = var.enable_message_ordering
  ack_deadline_seconds         = var.ack_deadline_seconds
  message_retention_duration   = var.message_retention_duration
  retain_acked_messages        = false

  retry_policy {
    minimum_backoff = var.minimum_backoff
    maximum_backoff = var.maximum_backoff
  }

  dead_letter_policy {
    dead_letter_topic     = google_pubsub_topic.dead_letter.id
    max_delivery_attempts = var.max_delivery_attempts
  }

  # Never delete the subscription for inactivity.
  expiration_policy {
    ttl = ""
  }

  lifecycle {
    precondition {
      condition     = var.create_topic || var.topic_id != null
      error_message = "topic_id is required when create_topic is false."
    }
  }
}

# Dead-lettering acts as the Pub/Sub service agent: it must be able to publish to the dead-letter
# topic and to acknowledge (subscribe) on the source subscription.
resource "google_pubsub_topic_iam_member" "dead_letter_publisher" {
  project = var.project_id
  topic   = google_pubsub_topic.dead_letter.name
  role    = "roles/pubsub.publisher"
  member  = local.pubsub_service_agent
}

resource "google_pubsub_subscription_iam_member" "dead_letter_subscriber" {
  project      = var.project_id
  subscription = google_pubsub_subscription.bridge.name
  role         = "roles/pubsub.subscriber"
  member       = local.pubsub_service_agent
}

# The bridge's identity: subscriber on its subscription only (pull, ack, modify ack deadline).
# No project-level role, no publish, no access to the dead-letter subscription.
resource "google_service_account" "bridge" {
  project      = var.project_id
  account_id   = coalesce(var.service_account_id, local.default_account_id)
  display_name = "fencebridge consumer of ${var.name}"
}

resource "google_pubsub_subscription_iam_member" "bridge_subscriber" {
  project      = var.project_id
  subscription = google_pubsub_subscription.bridge.name
  role         = "roles/pubsub.subscriber"
  member       = "serviceAccount:${google_service_account.bridge.email}"
}

resource "google_service_account_iam_member" "workload_identity" {
  count = var.kubernetes_service_account == null ? 0 : 1

  service_account_id = google_service_account.bridge.name
  role               = "roles/iam.workloadIdentityUser"
  member             = "serviceAccount:${var.project_id}.svc.id.goog[${var.kubernetes_service_account}]"
}
