output "topic_id" {
  description = "The topic the subscription reads (projects/<p>/topics/<t>)."
  value       = local.topic_id
}

output "subscription_id" {
  description = "The subscription the bridge's configuration names (projects/<p>/subscriptions/<s>)."
  value       = google_pubsub_subscription.bridge.id
}

output "dead_letter_topic_id" {
  description = "The dead-letter topic."
  value       = google_pubsub_topic.dead_letter.id
}

output "dead_letter_subscription_id" {
  description = "The subscription that keeps dead letters for inspection."
  value       = google_pubsub_subscription.dead_letter.id
}

output "bridge_service_account_email" {
  description = "The bridge's Google service account (annotate the Kubernetes service account with it)."
  value       = google_service_account.bridge.email
}
